#!/usr/bin/env bash
# Two network namespaces joined by a veth pair whose both ends are shaped with tc (tbf).
#
#   benchmarks/netns.sh up RATE [DELAY]   e.g. "up 100mbit" or "up 1gbit 1ms"
#   MTU=1500 benchmarks/netns.sh up RATE  the veth MTU (default 9000)
#   benchmarks/netns.sh down
#   benchmarks/netns.sh exec RANK CMD...  run CMD inside namespace chronica-RANK (0 or 1)
#
# Rank 0 is 10.77.0.1/24 in namespace chronica-0, rank 1 is 10.77.0.2/24 in chronica-1; the
# namespaces have no other interface, so no traffic leaves them. Needs root (ip, tc).
# The MTU defaults to 9000, the jumbo frames of training-cluster fabrics: at 1500 the kernel's
# per-packet work triples the CPU an all-reduce costs (21 against 7 ms for 4.5 MB at 1 Gbit/s),
# which on a small shared machine is taken from the ranks' computation.
# "up" removes whatever it built if any step fails; "down" is idempotent.
set -euo pipefail

NS0=chronica-0
NS1=chronica-1

down() {
  ip netns del "$NS0" 2>/dev/null || true
  ip netns del "$NS1" 2>/dev/null || true
}

up() {
  local rate=$1 delay=${2:-} mtu=${MTU:-9000}
  down
  trap 'down; trap - ERR; exit 1' ERR
  ip netns add "$NS0"
  ip netns add "$NS1"
  ip link add veth-chr0 netns "$NS0" type veth peer name veth-chr1 netns "$NS1"
  ip -n "$NS0" addr add 10.77.0.1/24 dev veth-chr0
  ip -n "$NS1" addr add 10.77.0.2/24 dev veth-chr1
  for pair in "$NS0 veth-chr0" "$NS1 veth-chr1"; do
    set -- $pair
    ip -n "$1" link set lo up
    ip -n "$1" link set "$2" mtu "$mtu" up
    # A token bucket at RATE with a queue of ~50 ms; optional one-way DELAY with netem.
    if [[ -n "$delay" ]]; then
      ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay"
      ip netns exec "$1" tc qdisc add dev "$2" parent 1: handle 2: tbf rate "$rate" burst 64kb latency 50ms
    else
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 64kb latency 50ms
    fi
  done
  trap - ERR
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  exec)
    rank=$2; shift 2
    exec ip netns exec "chronica-$rank" "$@"
    ;;
  *) echo "usage: $0 up RATE [DELAY] | down | exec RANK CMD..." >&2; exit 2 ;;
esac
