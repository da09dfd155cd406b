#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Weight sync between two hosts made of network namespaces joined by a veth pair (root and
# iproute2; ucx_perftest from ucx-utils): UCX's own bandwidth test (ucp_am_bw over TCP, 64 MiB
# messages) as the link's limit, then rlpt's TCP transport and its UCX transport publishing a
# dense TOTAL_MB model in 64 MiB buckets, plain and authenticated (integrity::full). One JSON
# line per run, the load average before and after. Everything it creates is removed on exit.
#
#   bench/sync/netns_pair.sh BENCH_SYNC_RUNNER [TOTAL_MB=1024] [REPS=3] [RATE (tc tbf, e.g. 10gbit)]
set -u
runner=${1:?usage: netns_pair.sh BENCH_SYNC_RUNNER [TOTAL_MB] [REPS] [RATE]}
total=${2:-1024}
reps=${3:-3}
rate=${4:-}
source "$(dirname "$0")/../../tests/sync/netns_lib.sh"
netns_require_root
tag=b$$
a=rlpt-a-$tag
b=rlpt-b-$tag
cleanup() {
  for n in "$a" "$b"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b"
ip link add "va$tag" type veth peer name "vb$tag"
ip link set "va$tag" netns "$a"
ip link set "vb$tag" netns "$b"
ip -n "$a" addr add 10.232.1.1/24 dev "va$tag"
ip -n "$b" addr add 10.232.1.2/24 dev "vb$tag"
for n in "$a" "$b"; do ip -n "$n" link set lo up; done
ip -n "$a" link set "va$tag" up
ip -n "$b" link set "vb$tag" up
if [[ -n $rate ]]; then
  ip netns exec "$a" tc qdisc add dev "va$tag" root tbf rate "$rate" burst 1mb latency 50ms
fi
machine_json "rate:\"${rate:-veth}\""

# The engine's own bandwidth test: host b serves, host a sends.
if command -v ucx_perftest >/dev/null; then
  UCX_TLS=tcp ip netns exec "$b" timeout 120 ucx_perftest -t ucp_am_bw -s 67108864 -n 16 -p 13400 >/dev/null 2>&1 &
  sleep 1
  line=$(UCX_TLS=tcp ip netns exec "$a" timeout 120 ucx_perftest 10.232.1.2 -t ucp_am_bw -s 67108864 -n 16 -p 13400 2>&1 |
    grep '^Final')
  wait
  echo "{\"bench\":\"ucx_perftest ucp_am_bw tcp 64MiB\",\"MBps\":$(echo "$line" | awk '{print $6}')}"
fi

port=13500
one() { # kind, extra options...
  local kind=$1
  shift
  port=$((port + 1))
  ip netns exec "$b" "$runner" serve "$kind" 10.232.1.2 "$port" $((reps + 1)) "$@" >/dev/null &
  local server=$!
  sleep 0.5
  ip netns exec "$a" "$runner" publish "$kind" 10.232.1.2 "$port" "$total" 64 "$reps" "$@"
  wait "$server" || echo "{\"error\":\"$kind $* receiver failed\"}"
}
one tcp
one ucx tls=tcp
one tcp auth-full
one ucx tls=tcp auth-full
one ucx # UCX's own choice: on one machine it may take shared memory across the namespaces
echo "{\"load_after\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
