#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Authenticated weight sync across hosts: network namespaces joined by a bridge (in a namespace
# of its own) stand in for a trainer, two inference hosts and an intruder on one LAN; the
# trainer's link is bandwidth-limited with tc tbf. Checks that the job's peers get every
# version bit-exact while the intruder (another secret, or none) is refused every time and
# nothing it sends is published; then that forwarding (trainer -> inf1 -> inf2) delivers the
# same versions while the trainer's uplink carries one copy instead of two (its interface's
# byte counter). Needs root and iproute2: exit 77 (skipped) otherwise.
# Everything it creates is removed on exit.
#
#   netns_cluster.sh <path to sync_node>
set -u
node=${1:?usage: netns_cluster.sh SYNC_NODE}
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 (ip netns)"
  exit 77
fi
tag=r$$
lan=rlpt-lan-$tag
hosts=(trainer inf1 inf2 intruder)
declare -A addr=([trainer]=10.231.7.1 [inf1]=10.231.7.2 [inf2]=10.231.7.3 [intruder]=10.231.7.9)
ns() { echo "rlpt-$1-$tag"; }
cleanup() {
  for h in "${hosts[@]}"; do ip netns pids "$(ns "$h")" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for h in "${hosts[@]}"; do ip netns del "$(ns "$h")" 2>/dev/null; done
  ip netns del "$lan" 2>/dev/null
  rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT
if ! ip netns add "$lan" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here"
  exit 77
fi
ip -n "$lan" link add br0 type bridge && ip -n "$lan" link set br0 up
i=0
for h in "${hosts[@]}"; do
  i=$((i + 1))
  ip netns add "$(ns "$h")"
  ip link add "v$tag$i" type veth peer name "p$tag$i"
  ip link set "v$tag$i" netns "$(ns "$h")"
  ip link set "p$tag$i" netns "$lan"
  ip -n "$lan" link set "p$tag$i" master br0 up
  ip -n "$(ns "$h")" link set "v$tag$i" name eth0
  ip -n "$(ns "$h")" addr add "${addr[$h]}/24" dev eth0
  ip -n "$(ns "$h")" link set eth0 up
  ip -n "$(ns "$h")" link set lo up
done
# The trainer's uplink: 200 Mbit/s (token bucket; this kernel may lack netem).
ip netns exec "$(ns trainer)" tc qdisc add dev eth0 root tbf rate 200mbit burst 64kb latency 50ms

fail=0
check() { # name, expected (0 or nonzero), rc, output file, [grep pattern]
  local name=$1 want=$2 rc=$3 out=$4 pat=${5:-}
  local ok=1
  if [[ $want == 0 && $rc -ne 0 ]] || [[ $want != 0 && $rc -eq 0 ]]; then ok=0; fi
  if [[ -n $pat ]] && ! grep -q -- "$pat" "$out"; then ok=0; fi
  if [[ $ok == 1 ]]; then echo "ok: $name: $(tail -1 "$out")"; else
    echo "FAILED: $name (exit $rc, wanted ${want}${pat:+, output matching \"$pat\"}): $(cat "$out")"
    fail=1
  fi
}
run() { local h=$1; shift; ip netns exec "$(ns "$h")" "$@"; }

model=(--layers 40) # about 200 KB of bf16/f32 tensors
export RLPT_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export RLPT_OTHER_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

# Listening on a LAN address without a secret is refused unless explicitly opted out.
run inf1 "$node" recv "${addr[inf1]}" 5555 1 7 --listen --timeout-s 1 >"$work/insecure" 2>&1
check "listening on ${addr[inf1]} without a secret" 1 $? "$work/insecure" "rlpt.sync.insecure"

# The inference hosts wait for 3 versions, authenticated.
run inf1 "$node" recv "${addr[inf1]}" 5555 3 7 "${model[@]}" --listen --secret-env RLPT_JOB_SECRET --timeout-s 60 >"$work/inf1" 2>&1 &
p1=$!
run inf2 "$node" recv "${addr[inf2]}" 5555 3 7 "${model[@]}" --listen --secret-env RLPT_JOB_SECRET --timeout-s 60 >"$work/inf2" 2>&1 &
p2=$!
sleep 0.5
# The intruder: another job's secret (twice), then no secret at all (opting out of the check).
for k in 1 2; do
  run intruder "$node" send "${addr[inf1]}" 5555 1 99 --secret-env RLPT_OTHER_SECRET >"$work/intruder$k" 2>&1
  check "intruder with another secret, attempt $k" 1 $? "$work/intruder$k" "rlpt.sync.auth"
done
run intruder "$node" send "${addr[inf2]}" 5555 1 99 --insecure >"$work/intruder3" 2>&1
check "intruder without a secret" 1 $? "$work/intruder3"
# The trainer publishes 3 versions (dense, then deltas) to both directly, through its limited uplink.
tx_bytes() { run trainer cat /sys/class/net/eth0/statistics/tx_bytes; }
b0=$(tx_bytes)
run trainer "$node" send "${addr[inf1]}" 5555 3 7 "${model[@]}" --secret-env RLPT_JOB_SECRET >"$work/tx1" 2>&1 &
t1=$!
run trainer "$node" send "${addr[inf2]}" 5555 3 7 "${model[@]}" --secret-env RLPT_JOB_SECRET >"$work/tx2" 2>&1 &
t2=$!
wait $t1; check "trainer -> inf1" 0 $? "$work/tx1"
wait $t2; check "trainer -> inf2" 0 $? "$work/tx2"
wait $p1; check "inf1 received every version bit-exact, refused the intruder" 0 $? "$work/inf1" "refused peers [1-9]"
wait $p2; check "inf2 received every version bit-exact, refused the intruder" 0 $? "$work/inf2" "refused peers [1-9]"
direct=$(($(tx_bytes) - b0))

# Forwarding: trainer -> inf1 -> inf2; the trainer's uplink carries one copy of each update.
run inf2 "$node" recv "${addr[inf2]}" 5601 3 7 "${model[@]}" --listen --secret-env RLPT_JOB_SECRET --timeout-s 60 >"$work/leaf" 2>&1 &
p2=$!
run inf1 "$node" forward "${addr[inf1]}" 5600 3 7 "${model[@]}" --listen --secret-env RLPT_JOB_SECRET --timeout-s 60 \
  --to "${addr[inf2]}:5601" >"$work/fwd" 2>&1 &
p1=$!
sleep 0.3
b0=$(tx_bytes)
run trainer "$node" send "${addr[inf1]}" 5600 3 7 "${model[@]}" --secret-env RLPT_JOB_SECRET >"$work/tx3" 2>&1
check "trainer -> inf1 (forwarding)" 0 $? "$work/tx3"
wait $p1; check "inf1 received every version bit-exact and forwarded it" 0 $? "$work/fwd" "forwarded .* 0 failures"
wait $p2; check "inf2 received every version bit-exact through inf1" 0 $? "$work/leaf" "received version 3"
forwarded=$(($(tx_bytes) - b0))
echo "trainer uplink bytes for 3 versions to 2 hosts: direct $direct, forwarded $forwarded"
if (( forwarded * 3 > direct * 2 )); then
  echo "FAILED: forwarding did not cut the trainer's outgoing bytes (direct $direct, forwarded $forwarded)"
  fail=1
fi
exit $fail
