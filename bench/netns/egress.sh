#!/usr/bin/env bash
# Egress through slirp4netns (what the gateway runs) beside pasta (the
# other user-mode stack) and veth + nftables NAT (the kernel path), from a
# tenant-like namespace to a server in an "outside" namespace, each sent
# three times. Prints setup time and TCP throughput for each run.
# Needs root, ip, nft, slirp4netns, pasta, python3.
# Usage: bench/netns/egress.sh [MiB]
set -euo pipefail
MIB=${1:-2048}
id=$$
gw=egb-gw-$id net=egb-net-$id ten=egb-ten-$id ten2=egb-ten2-$id ten3=egb-ten3-$id
cleanup() {
  [[ -n ${PASTA:-} ]] && kill "$PASTA" 2>/dev/null || true
  [[ -n ${SLIRP:-} ]] && kill "$SLIRP" 2>/dev/null || true
  [[ -n ${SINK:-} ]] && kill "$SINK" 2>/dev/null || true
  for n in $gw $net $ten $ten2 $ten3; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT
for n in $gw $net $ten $ten2 $ten3; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add egb0 netns "$gw" type veth peer name egb1 netns "$net"
ip -n "$gw" addr add 198.51.100.2/24 dev egb0; ip -n "$gw" link set egb0 up
ip -n "$net" addr add 198.51.100.1/24 dev egb1; ip -n "$net" link set egb1 up
ip -n "$net" addr add 203.0.113.10/32 dev lo
ip -n "$gw" route add default via 198.51.100.1

SINK_PY='
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("203.0.113.10", 9000)); s.listen(4)
while True:
    c, _ = s.accept()
    buf = bytearray(1 << 20)
    while c.recv_into(buf):
        pass
    c.close()'
ip netns exec "$net" python3 -c "$SINK_PY" & SINK=$!
sleep 0.5

SEND_PY='
import socket, sys, time
n = int(sys.argv[1]) << 20
s = socket.create_connection(("203.0.113.10", 9000))
buf = b"x" * (1 << 20)
t = time.perf_counter(); sent = 0
while sent < n:
    s.sendall(buf); sent += len(buf)
s.shutdown(socket.SHUT_WR); s.recv(1)
dt = time.perf_counter() - t
print(f"{n / dt / 1e6:.0f} MB/s ({n >> 20} MiB in {dt:.2f} s)")'

now() { date +%s%N; }
three() { for _ in 1 2 3; do ip netns exec "$1" python3 -c "$SEND_PY" "$MIB" 2>&1 | tail -1; done | paste -sd';' -; }
# slirp4netns, as the gateway starts it.
t0=$(now)
ip netns exec "$gw" slirp4netns --configure --mtu 65520 --disable-host-loopback \
  --enable-sandbox --enable-seccomp --netns-type=path "/run/netns/$ten3" tap0 >/dev/null 2>&1 & SLIRP=$!
until ip -n "$ten3" addr show tap0 2>/dev/null | grep -q "inet "; do sleep 0.001; done
t1=$(now)
echo "slirp4netns: ready in $(( (t1 - t0) / 1000000 )) ms; $(three "$ten3")"

# pasta (Debian 12's), as the gateway first ran it.
t0=$(now)
ip netns exec "$gw" pasta --runas 0:0 --config-net --quiet --foreground \
  --tcp-ports none --udp-ports none --tcp-ns none --udp-ns none --no-map-gw --ipv4-only \
  --dns-forward 169.254.0.53 --netns "/run/netns/$ten" --pid "/tmp/egb-$id.pid" & PASTA=$!
while [[ ! -s /tmp/egb-$id.pid ]]; do sleep 0.001; done
t1=$(now); rm -f "/tmp/egb-$id.pid"
echo "pasta: ready in $(( (t1 - t0) / 1000000 )) ms; $(three "$ten")"

# veth + nftables masquerade in the gateway's namespace.
t0=$(now)
ip link add egb2 netns "$gw" type veth peer name egb3 netns "$ten2"
ip -n "$gw" addr add 100.96.0.1/30 dev egb2; ip -n "$gw" link set egb2 up
ip -n "$ten2" addr add 100.96.0.2/30 dev egb3; ip -n "$ten2" link set egb3 up
ip -n "$ten2" route add default via 100.96.0.1
ip netns exec "$gw" sysctl -qw net.ipv4.ip_forward=1
ip netns exec "$gw" nft -f - <<NFT
table ip egb {
  chain post {
    type nat hook postrouting priority 100; policy accept;
    oifname "egb0" masquerade
  }
}
NFT
t1=$(now)
echo "veth+nft: ready in $(( (t1 - t0) / 1000000 )) ms; $(three "$ten2")"
echo "direct (no tenant namespace): $(three "$gw")"
