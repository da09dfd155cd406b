#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The time for one update to reach 4 inference hosts, directly vs forwarded: a trainer and
# inf1..inf4 are network namespaces on one bridge, every host's uplink limited to RATE (tc tbf),
# each host a sync_node process (tests/sync/sync_node.cpp). One dense version of a MIB-MiB bf16
# model (1 MiB buckets, authenticated TCP), from the moment the trainer's first sender has its
# model built ("sending from") until the last host published it ("published version 1 ... at";
# each receiver then checks every tensor bit-exact), and the trainer's uplink bytes, for:
#   direct    the trainer runs 4 senders at once (its uplink carries 4 copies);
#   chain-sf  trainer -> inf1 -> inf2 -> inf3 -> inf4, store-and-forward (each host passes a
#             version on once it has published it);
#   tree-sf   trainer -> inf1 -> {inf2, inf3}, inf2 -> inf4 (fan-out 2), store-and-forward;
#   chain     the chain, cut-through (frames passed on as they arrive: forwarder's default);
#   tree      the tree, cut-through.
# ROUNDS rounds, the layouts interleaved; one line per run. Root and iproute2; removes what it creates.
# TRANSPORT=ucx runs it over the UCX transport (UCX's TCP transport between the hosts);
# LAYOUTS="chain tree" runs only those layouts.
#
#   bench/sync/netns_fanout.sh SYNC_NODE [MIB=64] [RATE=1gbit] [ROUNDS=3]
set -u
node=${1:?usage: netns_fanout.sh SYNC_NODE [MIB] [RATE] [ROUNDS]}
mib=${2:-64}
rate=${3:-1gbit}
rounds=${4:-3}
source "$(dirname "$0")/../../tests/sync/netns_lib.sh"
netns_require_root
declare -A addr=([trainer]=10.233.7.1 [inf1]=10.233.7.2 [inf2]=10.233.7.3 [inf3]=10.233.7.4 [inf4]=10.233.7.5)
cleanup() {
  netns_cleanup
  [[ -n ${KEEP:-} ]] && echo "kept $work" || rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT
netns_lan f "f$$" trainer inf1 inf2 inf3 inf4
for h in "${netns_hosts[@]}"; do nx "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms; done
export RLPT_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
opts=(--layers 2 --extra-kib $((mib * 1024)) --bucket-kib 1024 --secret-env RLPT_JOB_SECRET --step-timeout-ms 60000
  --commit-timeout-ms 60000 --transport "${TRANSPORT:-tcp}")
wait_listening() { for _ in $(seq 500); do listening "$1" "$2" && return 0; sleep 0.02; done; return 1; }
recv() { # host port [--to host:port]...
  local h=$1 p=$2; shift 2
  local cmd=recv mode=(); [[ $# -gt 0 ]] && cmd=forward
  [[ $cmd == forward && $layout == *-sf ]] && mode=(--store-and-forward)
  nx "$h" timeout 300 "$node" "$cmd" "${addr[$h]}" "$p" 1 7 --listen --timeout-s 280 "${opts[@]}" "${mode[@]}" "$@" \
    >"$work/$id.rx.$h" 2>&1 &
  pids+=($!)
}
machine_json "rate:\"$rate\"" "transport:\"${TRANSPORT:-tcp}\"" "model_mib:$mib"
port=6000
for r in $(seq "$rounds"); do
  for layout in ${LAYOUTS:-direct chain-sf tree-sf chain tree}; do
    port=$((port + 10))
    id=$layout.$r
    pids=()
    case $layout in
      direct) for h in inf1 inf2 inf3 inf4; do recv "$h" "$port"; done ;;
      chain*)
        recv inf4 $((port + 4))
        recv inf3 $((port + 3)) --to "${addr[inf4]}:$((port + 4))"
        recv inf2 $((port + 2)) --to "${addr[inf3]}:$((port + 3))"
        recv inf1 $((port + 1)) --to "${addr[inf2]}:$((port + 2))"
        ;;
      tree*)
        recv inf4 $((port + 4))
        recv inf3 $((port + 3))
        recv inf2 $((port + 2)) --to "${addr[inf4]}:$((port + 4))"
        recv inf1 $((port + 1)) --to "${addr[inf2]}:$((port + 2))" --to "${addr[inf3]}:$((port + 3))"
        ;;
    esac
    case $layout in
      direct) for h in inf1 inf2 inf3 inf4; do wait_listening "$h" "$port"; done ;;
      *) for k in 1 2 3 4; do wait_listening "inf$k" $((port + k)); done ;;
    esac
    b0=$(tx_bytes trainer)
    if [[ $layout == direct ]]; then
      for h in inf1 inf2 inf3 inf4; do
        nx trainer timeout 300 "$node" send "${addr[$h]}" "$port" 1 7 "${opts[@]}" >"$work/$id.tx.$h" 2>&1 &
      done
    else
      nx trainer timeout 300 "$node" send "${addr[inf1]}" $((port + 1)) 1 7 "${opts[@]}" >"$work/$id.tx.inf1" 2>&1 &
    fi
    ok=true
    for p in "${pids[@]}"; do wait "$p" || ok=false; done
    wait
    t0=$(awk '/^sending from/ {print $3}' "$work/$id".tx.* | sort -n | head -1)
    t1=$(awk '/^published version 1 / {print $NF}' "$work/$id".rx.* | sort -n | tail -1)
    n=$(cat "$work/$id".rx.* | grep -c "^published version 1 ")
    [[ $n == 4 ]] || ok=false
    echo "{\"layout\":\"$layout\",\"round\":$r,\"seconds\":$(echo "$t1 - $t0" | bc),\"trainer_uplink_bytes\":$(($(tx_bytes trainer) - b0)),\"all_bit_exact\":$ok}"
  done
done
echo "{\"load_after\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
