#!/usr/bin/env bash
# A tenant's HTTPS download through egress by name (the gateway's
# transparent proxy and resolver in its namespace), and through it with a
# substituted secret (the proxy ends TLS with the tenant's CA, puts the
# value into the Authorization header, and makes TLS of its own to the
# host), against the same download with CIDR rules only (straight out
# through slirp4netns), and the connect + TLS handshake p50 of each: the real gateway (release build),
# two tenants, a dnsmasq resolver and a Python HTTPS server in an "outside"
# namespace, curl inside each tenant (run through `exec-gateway exec`).
# Needs root, ip, nft, slirp4netns, dnsmasq, openssl, curl, python3.
# Usage: bench/netns/names.sh [MiB] [downloads] [handshakes]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${EXEC_GATEWAY:-$PWD/target/release/exec-gateway}
MIB=${1:-256} RUNS=${2:-3} SHAKES=${3:-30}
[[ -x $BIN ]] || { echo "build it first: cargo build --release ($BIN)" >&2; exit 1; }
id=$$ gw=egn-gw-$$ net=egn-net-$$
dir=$(mktemp -d) port=18765
cleanup() {
  [[ -n ${GW:-} ]] && kill "$GW" 2>/dev/null || true
  [[ -n ${SRV:-} ]] && kill "$SRV" 2>/dev/null || true
  [[ -n ${DNS:-} ]] && kill "$DNS" 2>/dev/null || true
  wait 2>/dev/null || true
  for n in $gw $net; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "/etc/netns/$gw" "$dir"
}
trap cleanup EXIT
for n in $gw $net; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add "egn$id" netns "$gw" type veth peer name "egm$id" netns "$net"
ip -n "$gw" addr add 198.51.100.2/24 dev "egn$id"; ip -n "$gw" link set "egn$id" up
ip -n "$net" addr add 198.51.100.1/24 dev "egm$id"; ip -n "$net" link set "egm$id" up
ip -n "$net" addr add 93.184.215.10/32 dev lo
ip -n "$net" addr add 10.77.0.53/32 dev lo
ip -n "$gw" route add default via 198.51.100.1
mkdir -p "/etc/netns/$gw"
echo "nameserver 10.77.0.53" > "/etc/netns/$gw/resolv.conf"
ip netns exec "$net" dnsmasq --keep-in-foreground --no-resolv --no-hosts \
  --listen-address=10.77.0.53 --bind-interfaces --local=/test/ \
  --host-record=big.test,93.184.215.10 --pid-file= & DNS=$!

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench-ca \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=big.test \
  -keyout "$dir/srv.key" -out "$dir/srv.csr" 2>/dev/null
printf 'subjectAltName=DNS:big.test\n' > "$dir/ext"
openssl x509 -req -in "$dir/srv.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -days 1 -extfile "$dir/ext" -out "$dir/srv.pem" 2>/dev/null
SRV_PY='
import http.server, socketserver, ssl, sys
CHUNK = b"\0" * (1 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        mib = int(self.path.split("=")[1]) if "=" in self.path else 0
        self.send_response(200)
        self.send_header("Content-Length", str(max(mib << 20, 2)))
        self.end_headers()
        if mib == 0:
            self.wfile.write(b"ok")
        for _ in range(mib):
            self.wfile.write(CHUNK)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = S(("93.184.215.10", 443), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()'
ip netns exec "$net" python3 -c "$SRV_PY" "$dir/srv.pem" "$dir/srv.key" & SRV=$!

head -c 32 /dev/urandom | base64 > "$dir/hs256.key"
# Every tenant's curl reads a bundle of the same size (the system's roots
# and one more CA: the bench's, or for subst the tenant's own, bound over
# the system bundle), so the handshakes differ by the path alone.
for t in cidr names subst; do
  mkdir -p "$dir/$t"
  cat /etc/ssl/certs/ca-certificates.crt "$dir/ca.pem" > "$dir/$t/ca.pem"
done
echo "bench-secret-value" > "$dir/api.key"
chmod 755 "$dir" "$dir/cidr" "$dir/names" "$dir/subst"
cat > "$dir/gw.toml" <<TOML
[server]
listen = "ws://127.0.0.1:$port"
admin_listen = "off"
[isolation]
network = "required"
[[auth.keys]]
algorithm = "HS256"
secret_file = "$dir/hs256.key"
[tenants.cidr]
root = "$dir/cidr"
egress = ["93.184.215.10/32"]
[tenants.names]
root = "$dir/names"
egress_names = ["big.test"]
[tenants.subst]
root = "$dir/subst"
egress_names = ["big.test"]
http_ca_file = "$dir/ca.pem"
[tenants.subst.secrets.API_KEY]
file = "$dir/api.key"
hosts = ["big.test"]
substitute = true
TOML
# The server and resolver answer before the gateway starts.
for _ in $(seq 100); do
  ip netns exec "$gw" curl -sf --cacert "$dir/ca.pem" https://big.test/ >/dev/null && break
  sleep 0.1
done
ip netns exec "$gw" "$BIN" serve --config "$dir/gw.toml" 2>"$dir/gw.log" & GW=$!
for _ in $(seq 100); do
  ip netns exec "$gw" curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done

run() { # tenant, curl arguments...
  local t=$1; shift
  if [[ $t == subst ]]; then
    # The system bundle (the tenant CA's), the placeholder in a header.
    ip netns exec "$gw" "$BIN" exec --url "ws://127.0.0.1:$port" --token "${TOKEN[$t]}" \
      -- sh -c 'exec curl -s -o /dev/null -H "Authorization: Bearer $API_KEY" "$@"' sh "$@"
  else
    ip netns exec "$gw" "$BIN" exec --url "ws://127.0.0.1:$port" --token "${TOKEN[$t]}" \
      -- curl -s -o /dev/null --cacert "$dir/$t/ca.pem" "$@"
  fi
}
declare -A TOKEN
for t in cidr names subst; do
  TOKEN[$t]=$("$BIN" token --config "$dir/gw.toml" --tenant "$t" --scope exec | tail -1)
done

echo "exec-gateway $("$BIN" --version | awk '{print $2}'), $MIB MiB over HTTPS, $RUNS runs; $SHAKES handshakes"
declare -A MBS P50
for t in cidr names subst; do
  run "$t" https://big.test/ >/dev/null   # warm: the tenant's activation
  speeds=()
  for _ in $(seq "$RUNS"); do
    speeds+=("$(run "$t" -w '%{speed_download}' "https://big.test/?mib=$MIB")")
  done
  shakes=()
  for _ in $(seq "$SHAKES"); do
    shakes+=("$(run "$t" -w '%{time_appconnect}' https://big.test/)")
  done
  MBS[$t]=$(printf '%s\n' "${speeds[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.0f", a[int((NR+1)/2)]/1e6}')
  P50[$t]=$(printf '%s\n' "${shakes[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]*1000}')
  echo "  $t: download MB/s (each run) $(printf '%s\n' "${speeds[@]}" | awk '{printf "%.0f ", $1/1e6}')-> median ${MBS[$t]}; connect+TLS p50 ${P50[$t]} ms"
done
awk -v c="${MBS[cidr]}" -v n="${MBS[names]}" -v s="${MBS[subst]}" \
    -v pc="${P50[cidr]}" -v pn="${P50[names]}" -v ps="${P50[subst]}" 'BEGIN {
  printf "names / CIDR throughput: %.0f%%; connect+TLS p50 difference: %+.3f ms\n", 100*n/c, pn-pc
  printf "names + substitution / CIDR throughput: %.0f%%; connect+TLS p50 difference: %+.3f ms\n", 100*s/c, ps-pc }'
