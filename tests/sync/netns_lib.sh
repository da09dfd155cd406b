# SPDX-License-Identifier: Apache-2.0
# Shared by the namespaced-host scripts (tests/sync/netns_cluster.sh, bench/sync/netns_fanout.sh,
# bench/sync/netns_pair.sh): source it, then
#   netns_require_root           exit 77 (skipped) unless root with iproute2 and tc
#   netns_lan PREFIX TAG HOST... a LAN: a bridge in namespace "$lan" and one namespace per host,
#                                named $(ns HOST), each with eth0 at ${addr[HOST]}/24 on the bridge
#                                (its bridge-side device in ${port[HOST]}); declare -A addr first
#   ns HOST, nx HOST CMD...      the host's namespace name; CMD run inside it
#   netns_cleanup                kills every process in the namespaces and deletes them
#   listening HOST PORT, tx_bytes HOST, rx_bytes HOST, kill_host HOST
#   machine_json [KEY:VALUE]...  one JSON line: CPU model, cores, load average and the fields given

netns_require_root() {
  if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "skipped: needs root and iproute2 (ip netns, tc)"
    exit 77
  fi
}

netns_hosts=()
declare -A port
ns() { echo "rlpt-$netns_prefix$1-$netns_tag"; }
nx() {
  local h=$1
  shift
  ip netns exec "$(ns "$h")" "$@"
}

netns_lan() { # prefix tag host...
  netns_prefix=$1 netns_tag=$2
  shift 2
  netns_hosts=("$@")
  lan=rlpt-${netns_prefix}lan-$netns_tag
  if ! ip netns add "$lan" 2>/dev/null; then
    echo "skipped: cannot create network namespaces here"
    exit 77
  fi
  ip -n "$lan" link add br0 type bridge && ip -n "$lan" link set br0 up
  local i=0 h
  for h in "${netns_hosts[@]}"; do
    i=$((i + 1))
    port[$h]=p$netns_tag$i
    ip netns add "$(ns "$h")"
    ip link add "v$netns_tag$i" type veth peer name "p$netns_tag$i"
    ip link set "v$netns_tag$i" netns "$(ns "$h")"
    ip link set "p$netns_tag$i" netns "$lan"
    ip -n "$lan" link set "p$netns_tag$i" master br0 up
    ip -n "$(ns "$h")" link set "v$netns_tag$i" name eth0
    ip -n "$(ns "$h")" addr add "${addr[$h]}/24" dev eth0
    ip -n "$(ns "$h")" link set eth0 up
    ip -n "$(ns "$h")" link set lo up
  done
}

netns_cleanup() {
  local h
  for h in "${netns_hosts[@]}"; do ip netns pids "$(ns "$h")" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for h in "${netns_hosts[@]}"; do ip netns del "$(ns "$h")" 2>/dev/null; done
  [[ -n ${lan:-} ]] && ip netns del "$lan" 2>/dev/null
  return 0
}

listening() { nx "$1" ss -Hltn "sport = :$2" | grep -q .; }
tx_bytes() { nx "$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
rx_bytes() { nx "$1" cat /sys/class/net/eth0/statistics/rx_bytes; }
kill_host() { ip netns pids "$(ns "$1")" | xargs -r kill -9; }

machine_json() {
  local extra="" kv
  for kv in "$@"; do extra+=",\"${kv%%:*}\":${kv#*:}"; done
  echo "{\"machine\":\"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\",\"cores\":$(nproc)$extra,\"load_before\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
}
