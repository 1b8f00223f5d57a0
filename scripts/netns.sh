# Sourced by the scripts that emulate machines on this one (tests/slurm/multinode_test.sh, bench/wan/): hosts as
# network namespaces on one bridge. Needs root and iproute2.
#
# bridge_hosts PREFIX NET HOST…: namespace PREFIXw holds the bridge br0; each HOST gets namespace PREFIX<HOST> with
# the veth PREFIX<HOST>a (its peer PREFIX<HOST>b on the bridge) at NET.<k>/24, k = 1, 2, … in the order given, loopback
# up. Returns non-zero at the first step that fails (the caller tears down what exists: PREFIXw and each PREFIX<HOST>).
bridge_hosts() {
  local p=$1 net=$2 k=1 h
  shift 2
  ip netns add "${p}w" && ip -n "${p}w" link add br0 type bridge && ip -n "${p}w" link set br0 up || return 1
  for h in "$@"; do
    ip netns add "$p$h" &&
      ip link add "$p${h}a" type veth peer name "$p${h}b" &&
      ip link set "$p${h}a" netns "$p$h" &&
      ip link set "$p${h}b" netns "${p}w" &&
      ip -n "${p}w" link set "$p${h}b" master br0 up &&
      ip -n "$p$h" addr add "$net.$k/24" dev "$p${h}a" &&
      ip -n "$p$h" link set "$p${h}a" up &&
      ip -n "$p$h" link set lo up || return 1
    k=$((k + 1))
  done
}
