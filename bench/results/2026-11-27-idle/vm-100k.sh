#!/bin/bash
# Run as the one "test" of a scripts/vm-test guest (6.12, VM_MEM=8192): 100,000 idle
# websocket sessions need RLIMIT_NOFILE above this host's hard 20,000, and
# more ephemeral ports than one loopback source has (the bench spreads them).
ulimit -n 1048576
sysctl -qw net.ipv4.ip_local_port_range="1024 65000"
sysctl -qw net.core.somaxconn=65535
sysctl -qw net.ipv4.tcp_max_syn_backlog=65535
free -m
"$(dirname "$0")"/../../../target/release/exec-gateway-bench --memory-only --sessions "${SESSIONS:-100000}" 2>&1 | tail -4
free -m
