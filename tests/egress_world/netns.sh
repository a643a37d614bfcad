#!/bin/sh
# The egress world's network (tests/egress_names.rs): namespaces $1 (the
# gateway's) and $2 ("outside"), joined by a veth ($3 in $1, $4 in $2).
# The gateway's host reaches IPv4 and IPv6 through it; outside, on its
# loopback: the servers' public test addresses (servers.py), a private
# server (10.77.0.1) and the resolver (dnsmasq.conf) at 10.77.0.53 and at
# a "public resolver" address, 93.184.215.53. `ip netns exec $1` binds
# /etc/netns/$1/resolv.conf over /etc/resolv.conf: the host's resolver.
set -eu
gw=$1 net=$2 vg=$3 vn=$4
ip netns add "$gw"
ip netns add "$net"
ip link add "$vg" netns "$gw" type veth peer name "$vn" netns "$net"
ip -n "$gw" link set lo up
ip -n "$gw" link set "$vg" up
ip -n "$gw" addr add 198.51.100.2/24 dev "$vg"
ip -n "$gw" route add default via 198.51.100.1
ip -n "$gw" addr add 2001:db8:ff::2/64 dev "$vg" nodad
ip -n "$gw" -6 route add default via 2001:db8:ff::1
ip -n "$net" link set lo up
ip -n "$net" link set "$vn" up
ip -n "$net" addr add 198.51.100.1/24 dev "$vn"
ip -n "$net" addr add 2001:db8:ff::1/64 dev "$vn" nodad
ip -n "$net" addr add 2001:db8::10/128 dev lo
for a in 93.184.215.10 93.184.215.11 93.184.215.12 93.184.215.13 \
  93.184.215.53 10.77.0.1 10.77.0.53; do
  ip -n "$net" addr add "$a/32" dev lo
done
mkdir -p "/etc/netns/$gw"
echo "nameserver 10.77.0.53" >"/etc/netns/$gw/resolv.conf"
