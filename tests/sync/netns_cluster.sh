#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Authenticated weight sync across hosts. Network namespaces joined by a bridge (in a namespace
# of its own) stand in for one LAN: a trainer host, four inference hosts (inf1..inf4), a host in
# the middle that relays (this kernel has no netem: delay, stalls and resets come from
# sync_node's relay, tests/sync/relay.hpp) and an intruder. sync_node runs every host. In order:
#  1. clean links: the four inference hosts get 3 versions (dense, then deltas), each bit-exact,
#     while the intruder (another job's secret, or none) is refused by every one of them;
#  2. bandwidth-limited links (tc tbf on the trainer's uplink and on every inference host's
#     downlink): the same, and the qdiscs carried the updates;
#  3. forwarding along a chain trainer -> inf1 -> inf2 -> inf3 -> inf4 (cut-through: frames
#     passed on as they arrive): the same versions while the trainer's uplink carries one copy
#     instead of four (its interface's byte counter);
#  4. the relay host between the trainer and inf1, adding 5 ms per chunk, stalls and reset
#     connections: 6 versions still arrive bit-exact (the sender retries, the link reconnects);
#  5. the relay host as a man in the middle between the trainer and inf2, altering a manifest
#     (two tensor names swapped, layout hash recomputed) and a piece (checksum recomputed) with
#     every XXH3 re-sealed: inf2 refuses both frames (rlpt.sync.auth, refused frames counted),
#     publishes nothing from them and stays on version 1; the real sender then gets through;
#  6. inf3 and inf4 cut off (ip link set eth0 down; inf4's processes killed too: a host that went
#     down) while a 2.5 MB update is in flight: their senders report rlpt.sync.timeout within
#     sender_options::timeout / commit_timeout (2 s here, plus 1.5 s slack) and inf3's receiver
#     within receiver_options::timeout (2 s), while inf1 and inf2 complete; when the links are
#     back, inf3 (which kept version 1) catches up with a delta from version 1 and inf4
#     (restarted, holding nothing) refuses the delta and gets the version dense (the sender's
#     delta base is the last version the receiver acknowledged; protocol.hpp, machine.hpp);
#     both end on the latest version bit-exact;
#  6b. a cut-through forwarder (trainer -> inf1 -> {inf2, inf3}) whose downstream host inf3 is
#     killed mid-update: inf1 reports it within the bound, inf1 and inf2 get every version, and
#     the restarted inf3 gets the next version dense from inf1's mirror, then cut-through again;
#  6c. a 17 s silent outage between versions (every packet to and from inf1 and inf2 dropped,
#     no ARP failure to give it away; inf1 listening, inf2 connecting to a listening trainer),
#     with tcp_options::dead_peer_timeout at 2 s: both publish the next version within 5 s of
#     their path coming back (fresh connections, not the old ones' retransmission timers) and
#     end on the latest version bit-exact;
#  7. the same job over the UCX transport (sync_node --transport ucx, UCX's TCP transport
#     between the hosts), where sync_node was built with component ucx: the four inference hosts
#     get 3 versions bit-exact while an intruder with another secret is refused; a chain
#     trainer -> inf1 -> inf2 forwards over UCX; inf3's host killed mid-update is reported to its
#     sender within the bound while inf4 completes.
# Every process runs under timeout(1) and every wait is bounded. Needs root and iproute2: exit
# 77 (skipped) otherwise. Everything it creates (namespaces, veths, processes) is removed on exit.
#
#   netns_cluster.sh <path to sync_node>
set -u
node=${1:?usage: netns_cluster.sh SYNC_NODE}
source "$(dirname "$0")/netns_lib.sh"
netns_require_root
t_start=${EPOCHREALTIME/./}
infs=(inf1 inf2 inf3 inf4)
declare -A addr=([trainer]=10.231.7.1 [inf1]=10.231.7.2 [inf2]=10.231.7.3 [inf3]=10.231.7.4 [inf4]=10.231.7.5
  [relay]=10.231.7.8 [intruder]=10.231.7.9)
cleanup() {
  netns_cleanup
  rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT
netns_lan "" "r$$" trainer inf1 inf2 inf3 inf4 relay intruder

fail=0
passed=0
now_us() { echo "${EPOCHREALTIME/./}"; }
elapsed() { echo "$((($(now_us) - t_start) / 1000000))"; }
phase() { echo "== $* (at $(elapsed) s)"; }
pass() { echo "ok: $1: $2"; passed=$((passed + 1)); }
failed() { echo "FAILED: $1: $2"; fail=1; }
check() { # name, expected exit (0 or nonzero), exit, output file, [extended regex the output must match]...
  local name=$1 want=$2 rc=$3 out=$4 ok=1 missing=
  shift 4
  if [[ $want == 0 && $rc -ne 0 ]] || [[ $want != 0 && $rc -eq 0 ]]; then ok=0; fi
  for pat in "$@"; do grep -Eq -- "$pat" "$out" || { ok=0; missing+=" \"$pat\""; }; done
  if [[ $ok == 1 ]]; then pass "$name" "$(tail -1 "$out")"; else
    failed "$name" "exit $rc, wanted $want${missing:+, no line matching$missing}; output:"
    sed 's/^/    /' "$out"
  fi
}
# A command in host $1's namespace; run: sync_node there, bounded by timeout(1); spawn: the
# same in the background, $! its pid (timeout's, which passes a SIGTERM on to sync_node).
run() { local h=$1; shift; ip netns exec "$(ns "$h")" timeout -k 2 60 "$node" "$@"; }
spawn() { local h=$1; shift; ip netns exec "$(ns "$h")" timeout -k 2 60 "$node" "$@" & }
# Polls `command...` every 20 ms for up to $1 seconds; 1 if it never succeeded.
wait_until() {
  local until=$(($(now_us) + ${1%.*} * 1000000)); shift
  until "$@"; do (($(now_us) >= until)) && return 1; sleep 0.02; done
}
wait_listening() { # host port
  wait_until 10 listening "$1" "$2" || failed "$1 listens on port $2" "not listening after 10 s"
}
tbf_sent() { # namespace device: bytes its root qdisc sent
  ip netns exec "$1" tc -s qdisc show dev "$2" | awk '/^qdisc tbf/ {q = 1} q && /Sent/ {print $2; exit}'
}

model=(--layers 40) # about 210 KB of bf16/f32 tensors
secret=(--secret-env RLPT_JOB_SECRET)
export RLPT_JOB_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export RLPT_OTHER_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
declare -A rpid spid

# Receivers on every inference host: recv_all PORT VERSIONS NAME [options]...
recv_all() {
  local p=$1 n=$2 name=$3
  shift 3
  for h in "${infs[@]}"; do
    spawn "$h" recv "${addr[$h]}" "$p" "$n" 7 --listen "${secret[@]}" --timeout-s 40 "$@" >"$work/$name-$h" 2>&1
    rpid[$h]=$!
  done
  for h in "${infs[@]}"; do wait_listening "$h" "$p"; done
}
# One sender per inference host on the trainer: send_all PORT VERSIONS NAME [options]...
send_all() {
  local p=$1 n=$2 name=$3
  shift 3
  for h in "${infs[@]}"; do
    spawn trainer send "${addr[$h]}" "$p" "$n" 7 "${secret[@]}" "$@" >"$work/$name-tx-$h" 2>&1
    spid[$h]=$!
  done
}

phase "1. clean links: trainer -> inf1..inf4, with an intruder"
# Listening on a LAN address without a secret is refused unless explicitly opted out.
run inf1 recv "${addr[inf1]}" 5555 1 7 --listen --timeout-s 1 >"$work/insecure" 2>&1
check "listening on ${addr[inf1]} without a secret" 1 $? "$work/insecure" "rlpt.sync.insecure"
recv_all 5555 3 clean "${model[@]}"
# The intruder: another job's secret (inf1, twice; inf2), then no secret at all (inf3, inf4).
intrude() { # name, target, options...
  local name=$1 h=$2
  shift 2
  run intruder send "${addr[$h]}" 5555 1 99 "${model[@]}" --step-timeout-ms 2000 "$@" >"$work/$name" 2>&1
}
intrude intruder1 inf1 --secret-env RLPT_OTHER_SECRET
check "intruder with another secret -> inf1" 1 $? "$work/intruder1" "rlpt.sync.auth"
intrude intruder2 inf1 --secret-env RLPT_OTHER_SECRET
check "intruder with another secret -> inf1, again" 1 $? "$work/intruder2" "rlpt.sync.auth"
intrude intruder3 inf2 --secret-env RLPT_OTHER_SECRET
check "intruder with another secret -> inf2" 1 $? "$work/intruder3" "rlpt.sync.auth"
for h in inf3 inf4; do
  intrude "intruder-$h" "$h" --insecure
  check "intruder without a secret -> $h" 1 $? "$work/intruder-$h" "^error "
done
send_all 5555 3 clean "${model[@]}"
for h in "${infs[@]}"; do
  wait "${spid[$h]}"
  check "trainer -> $h (clean link)" 0 $? "$work/clean-tx-$h" "^sent 3 versions"
done
for h in "${infs[@]}"; do
  wait "${rpid[$h]}"
  check "$h received every version bit-exact, refused the intruder" 0 $? "$work/clean-$h" \
    "^received version 3 \(3 published, 0 failed\)" "refused peers [1-9]"
done

phase "2. bandwidth-limited links (tbf): trainer uplink 200 Mbit/s, inference downlinks 100 Mbit/s"
nx trainer tc qdisc add dev eth0 root tbf rate 200mbit burst 64kb latency 50ms
for h in "${infs[@]}"; do
  ip netns exec "$lan" tc qdisc add dev "${port[$h]}" root tbf rate 100mbit burst 32kb latency 50ms
done
recv_all 5556 3 tbf "${model[@]}"
b0=$(tx_bytes trainer)
send_all 5556 3 tbf "${model[@]}"
for h in "${infs[@]}"; do
  wait "${spid[$h]}"
  check "trainer -> $h (tbf)" 0 $? "$work/tbf-tx-$h" "^sent 3 versions"
done
for h in "${infs[@]}"; do
  wait "${rpid[$h]}"
  check "$h received every version bit-exact through tbf" 0 $? "$work/tbf-$h" "^received version 3 \(3 published, 0 failed\)"
done
direct=$(($(tx_bytes trainer) - b0))
sent=$(tbf_sent "$(ns trainer)" eth0)
if ((sent >= 4 * 200000)); then pass "the trainer's tbf carried the updates" "$sent bytes"; else
  failed "the trainer's tbf carried the updates" "its qdisc sent ${sent:-no} bytes, expected at least 4 x 200000"
fi
for h in "${infs[@]}"; do
  sent=$(tbf_sent "$lan" "${port[$h]}")
  ((sent >= 200000)) || failed "$h's downlink tbf carried the updates" "its qdisc sent ${sent:-no} bytes"
done

phase "3. forwarding: trainer -> inf1 -> inf2 -> inf3 -> inf4"
spawn inf4 recv "${addr[inf4]}" 5603 3 7 "${model[@]}" --listen "${secret[@]}" --timeout-s 40 >"$work/chain-inf4" 2>&1
rpid[inf4]=$!
for k in 3 2 1; do
  h=inf$k next=inf$((k + 1))
  spawn "$h" forward "${addr[$h]}" "560$((k - 1))" 3 7 "${model[@]}" --listen "${secret[@]}" --timeout-s 40 \
    --to "${addr[$next]}:560$k" >"$work/chain-$h" 2>&1
  rpid[$h]=$!
done
for k in 1 2 3 4; do wait_listening "inf$k" "560$((k - 1))"; done
b0=$(tx_bytes trainer)
run trainer send "${addr[inf1]}" 5600 3 7 "${model[@]}" "${secret[@]}" >"$work/chain-tx" 2>&1
check "trainer -> inf1 (forwarding)" 0 $? "$work/chain-tx" "^sent 3 versions"
for k in 1 2 3; do
  wait "${rpid[inf$k]}"
  check "inf$k received every version bit-exact and forwarded it (cut-through)" 0 $? "$work/chain-inf$k" \
    "^received version 3 \(3 published, 0 failed\)" "forwarded .* 0 failures" \
    "^forwarded version 1 to .* \(cut-through\)" "^forwarded version 3 to .* \(cut-through\)"
done
wait "${rpid[inf4]}"
check "inf4 received every version bit-exact through the chain" 0 $? "$work/chain-inf4" "^received version 3 \(3 published"
forwarded=$(($(tx_bytes trainer) - b0))
echo "trainer uplink bytes for 3 versions to 4 hosts: direct $direct, forwarded $forwarded"
if ((forwarded * 3 > direct)); then
  failed "forwarding cut the trainer's outgoing bytes" "direct $direct, forwarded $forwarded (wanted under a third)"
else
  pass "forwarding cut the trainer's outgoing bytes" "direct $direct, forwarded $forwarded"
fi

phase "4. a hostile network: the relay host between the trainer and inf1 (5 ms per chunk, stalls, resets)"
spawn relay relay "${addr[relay]}" 5700 "${addr[inf1]}:5701" 11 --timeout-s 50 >"$work/chaos-relay" 2>&1
relay_pid=$!
spawn inf1 recv "${addr[inf1]}" 5701 6 7 --layers 12 --listen "${secret[@]}" --timeout-s 50 >"$work/chaos-inf1" 2>&1
rpid[inf1]=$!
wait_listening relay 5700
wait_listening inf1 5701
run trainer send "${addr[relay]}" 5700 6 7 --layers 12 "${secret[@]}" --retries 30 --step-timeout-ms 5000 \
  >"$work/chaos-tx" 2>&1
check "trainer -> relay -> inf1: every version published, retrying failed attempts" 0 $? "$work/chaos-tx" \
  "^sent 6 versions.*, [1-9][0-9]* failed attempts"
wait "${rpid[inf1]}"
check "inf1 received every version bit-exact through the relay" 0 $? "$work/chaos-inf1" "^received version 6 "
kill -TERM "$relay_pid"
wait "$relay_pid"
rc=$?
read -r resets stalls < <(awk '/^relayed/ {print $(NF - 3), $(NF - 1)}' "$work/chaos-relay")
if [[ $rc -eq 0 && ${resets:-0} -ge 3 && ${stalls:-0} -ge 2 ]]; then
  pass "the relay reset and stalled connections" "$(tail -1 "$work/chaos-relay")"
else
  failed "the relay reset and stalled connections" \
    "exit $rc, resets ${resets:-?} (wanted >= 3), stalls ${stalls:-?} (>= 2): $(cat "$work/chaos-relay")"
fi

phase "5. a man in the middle: the relay host alters a manifest and a piece on their way to inf2"
spawn relay relay "${addr[relay]}" 5710 "${addr[inf2]}:5711" 0 --tamper manifest --tamper piece --timeout-s 50 \
  >"$work/mitm-relay" 2>&1
relay_pid=$!
spawn inf2 recv "${addr[inf2]}" 5711 3 7 "${model[@]}" --listen "${secret[@]}" --timeout-s 40 >"$work/mitm-inf2" 2>&1
rpid[inf2]=$!
wait_listening relay 5710
wait_listening inf2 5711
run trainer send "${addr[inf2]}" 5711 1 7 "${model[@]}" "${secret[@]}" >"$work/mitm-tx1" 2>&1
check "trainer -> inf2: version 1" 0 $? "$work/mitm-tx1" "^sent 1 versions"
# Version 2 through the man in the middle: two attempts, one altered manifest, one altered piece.
run trainer send "${addr[relay]}" 5710 2 7 "${model[@]}" "${secret[@]}" --first 2 --retries 2 --step-timeout-ms 3000 \
  >"$work/mitm-tx2" 2>&1
check "trainer -> relay -> inf2: both attempts at version 2 fail" 1 $? "$work/mitm-tx2" \
  "^version 2 attempt 1 failed" "^version 2 attempt 2 failed"
kill -TERM "$relay_pid"
wait "$relay_pid"
check "the relay altered a manifest and a piece, re-sealing every checksum" 0 $? "$work/mitm-relay" \
  "^altered: .*BEGIN of version 2: swapped the names" "^altered: .*bucket .* of version 2: flipped a byte" \
  "altered 2 frames"
# Then the real sender, directly: versions 2 and 3.
run trainer send "${addr[inf2]}" 5711 3 7 "${model[@]}" "${secret[@]}" --first 2 >"$work/mitm-tx3" 2>&1
check "trainer -> inf2: versions 2 and 3 after the attack" 0 $? "$work/mitm-tx3" "^sent 2 versions"
wait "${rpid[inf2]}"
check "inf2 refused both altered frames, stayed on version 1, then got every version bit-exact" 0 $? \
  "$work/mitm-inf2" "^refused a frame at .*\(holding version 1\): .*failed its full tag" \
  "^update of version 2 failed .*\(holding version 1\): rlpt.sync.auth" \
  "^received version 3 \(3 published, 1 failed\).*refused frames 2,"
# Nothing of the attack was published: version 2 is first published after the refused piece.
auth_line=$(grep -En -m1 "^update of version 2 failed .*rlpt.sync.auth" "$work/mitm-inf2" | cut -d: -f1)
pub_line=$(grep -n -m1 "^published version 2" "$work/mitm-inf2" | cut -d: -f1)
if [[ -n $auth_line && -n $pub_line && $pub_line -gt $auth_line ]]; then
  pass "inf2 published nothing from the man in the middle" "version 2 first published after the refusals"
else
  failed "inf2 published nothing from the man in the middle" "$(cat "$work/mitm-inf2")"
fi

phase "6. inf3 and inf4 cut off in the middle of an update"
# A 4 MiB tensor more, half its elements changed per version: the deltas move about 2.5 MB.
# inf3's and inf4's downlinks drop to 24 Mbit/s, so an update to them takes about a second; the
# senders' socket buffers are 256 KiB (tcp_options::socket_buffer), so a cut link blocks them
# mid-update instead of leaving the rest of the update queued in the kernel.
big=(--layers 8 --extra-kib 4096 --change 0.5)
for h in inf3 inf4; do
  ip netns exec "$lan" tc qdisc change dev "${port[$h]}" root tbf rate 24mbit burst 32kb latency 50ms
done
recv_all 5800 3 cut "${big[@]}" --step-timeout-ms 2000
send_all 5800 3 cut "${big[@]}" --retries 40 --retry-pause-ms 200 --step-timeout-ms 2000 --commit-timeout-ms 2000 \
  --socket-buffer-kib 256
# Cut each link once version 1 is published there and 300 KB of version 2 arrived.
declare -A cut_at base
cut_pending() {
  for h in inf3 inf4; do
    [[ -n ${cut_at[$h]:-} ]] && continue
    if [[ -z ${base[$h]:-} ]]; then
      grep -q "^published version 1 " "$work/cut-$h" && base[$h]=$(rx_bytes "$h")
    elif (($(rx_bytes "$h") - base[$h] >= 300000)); then
      nx "$h" ip link set eth0 down
      cut_at[$h]=$(now_us)
      if [[ $h == inf4 ]]; then # the host went down with its link
        disown "${rpid[inf4]}"     # (killed on purpose: no job report from bash)
        kill_host inf4
      fi
    fi
  done
  [[ -n ${cut_at[inf3]:-} && -n ${cut_at[inf4]:-} ]] && return 1
  return 0
}
until_us=$(($(now_us) + 30000000))
while cut_pending && (($(now_us) < until_us)); do sleep 0.01; done
for h in inf3 inf4; do
  if [[ -z ${cut_at[$h]:-} ]]; then failed "cut $h's link mid-update" "version 1 never published or version 2 never started"; fi
done
# The senders report the cut; inf3's receiver reports its update timed out.
reported() { grep -Eq "$2" "$1"; }
bound_ms=3500 # sender_options::timeout = commit_timeout = receiver_options::timeout = 2000 ms, plus 1.5 s slack
for h in inf3 inf4; do
  [[ -n ${cut_at[$h]:-} ]] || continue
  wait_until 8 reported "$work/cut-tx-$h" "^version 2 attempt 1 failed"
  line=$(grep -m1 "^version 2 attempt 1 failed" "$work/cut-tx-$h")
  at=$(awk '{print $7}' <<<"$line")
  ms=$(( ${at/./} - cut_at[$h] / 1000 ))
  if [[ -n $line && $line =~ (rlpt.sync.timeout|rlpt.sync.peer_lost) && $ms -ge 0 && $ms -le $bound_ms ]]; then
    pass "the sender to $h reported the cut in ${ms} ms (bound ${bound_ms} ms)" "$line"
  else
    failed "the sender to $h reported the cut within ${bound_ms} ms" "${ms:-?} ms: ${line:-nothing}; $(cat "$work/cut-tx-$h")"
  fi
done
if [[ -n ${cut_at[inf3]:-} ]]; then
  wait_until 8 reported "$work/cut-inf3" "^update of version 2 failed"
  line=$(grep -m1 "^update of version 2 failed" "$work/cut-inf3")
  at=$(awk '{print $7}' <<<"$line")
  ms=$(( ${at/./} - cut_at[inf3] / 1000 ))
  if [[ $line =~ \(holding\ version\ 1\):\ rlpt.sync.timeout && $ms -ge 0 && $ms -le $bound_ms ]]; then
    pass "inf3's receiver reported its update timed out in ${ms} ms, kept version 1" "$line"
  else
    failed "inf3's receiver reported its update timed out within ${bound_ms} ms" "${ms:-?} ms: ${line:-nothing}"
  fi
fi
# Meanwhile the other receivers complete.
for h in inf1 inf2; do
  wait "${spid[$h]}"
  check "trainer -> $h while inf3 and inf4 are cut off" 0 $? "$work/cut-tx-$h" "^sent 3 versions.*, 0 failed attempts"
  wait "${rpid[$h]}"
  check "$h received every version bit-exact while inf3 and inf4 are cut off" 0 $? "$work/cut-$h" \
    "^received version 3 \(3 published, 0 failed\)"
done
# The links come back; inf4 restarts, holding nothing.
for h in inf3 inf4; do nx "$h" ip link set eth0 up; done
spawn inf4 recv "${addr[inf4]}" 5800 3 7 "${big[@]}" --listen "${secret[@]}" --timeout-s 40 --step-timeout-ms 2000 \
  >"$work/cut-inf4-restarted" 2>&1
rpid[inf4]=$!
wait "${spid[inf3]}"
check "trainer -> inf3: version 2 again, as a delta from version 1 (inf3 kept it)" 0 $? "$work/cut-tx-inf3" \
  "^version 2: delta, .*attempt ([2-9]|[1-9][0-9])$" "^sent 3 versions"
wait "${rpid[inf3]}"
check "inf3 caught up with a delta and ends on version 3 bit-exact" 0 $? "$work/cut-inf3" \
  "^published version 2 \(delta from version 1\)" "^received version 3 \(3 published"
wait "${spid[inf4]}"
check "trainer -> inf4: version 2 again, dense (the restarted inf4 refused the delta)" 0 $? "$work/cut-tx-inf4" \
  "^version 2: dense \(fell back: the receiver refused a delta, sent dense\)" "^sent 3 versions"
wait "${rpid[inf4]}"
check "inf4 (restarted) caught up with a dense update and ends on version 3 bit-exact" 0 $? \
  "$work/cut-inf4-restarted" "^published version 2 \(dense\)" "^received version 3 \(2 published"

phase "6b. a host killed behind a cut-through forwarder: trainer -> inf1 -> {inf2, inf3}"
# inf3's downlink is still 24 Mbit/s. Its host is killed in the middle of version 2; inf1 reports
# the forwarding failed within the bound while inf2 and inf1 complete every version; inf3
# restarts holding nothing and gets version 3 dense from inf1's mirror (it refused the
# cut-through delta), then version 4 cut-through again. The trainer pauses 3.5 s between versions
# so that the restart lands between them.
ct=(--listen "${secret[@]}" --timeout-s 50 --step-timeout-ms 2000)
spawn inf2 recv "${addr[inf2]}" 5850 4 7 "${big[@]}" "${ct[@]}" >"$work/ct-inf2" 2>&1
rpid[inf2]=$!
spawn inf3 recv "${addr[inf3]}" 5851 4 7 "${big[@]}" "${ct[@]}" >"$work/ct-inf3" 2>&1
rpid[inf3]=$!
spawn inf1 forward "${addr[inf1]}" 5852 4 7 "${big[@]}" "${ct[@]}" --commit-timeout-ms 2000 \
  --to "${addr[inf2]}:5850" --to "${addr[inf3]}:5851" >"$work/ct-inf1" 2>&1
rpid[inf1]=$!
for hp in inf2:5850 inf3:5851 inf1:5852; do wait_listening "${hp%:*}" "${hp#*:}"; done
spawn trainer send "${addr[inf1]}" 5852 4 7 "${big[@]}" "${secret[@]}" --step-timeout-ms 2000 \
  --commit-timeout-ms 2000 --version-pause-ms 3500 >"$work/ct-tx" 2>&1
spid[inf1]=$!
wait_until 20 reported "$work/ct-inf3" "^published version 1 " ||
  failed "inf3 published version 1 through inf1" "$(cat "$work/ct-inf3")"
base3=$(rx_bytes inf3)
into_v2() { (($(rx_bytes inf3) - base3 >= 300000)); }
wait_until 20 into_v2 || failed "version 2 under way to inf3" "$(($(rx_bytes inf3) - base3)) bytes arrived"
disown "${rpid[inf3]}"
kill_host inf3
killed_at=$(now_us)
wait_until 10 reported "$work/ct-inf1" "^forwarding version 2 to ${addr[inf3]}:5851 failed"
line=$(grep -m1 "^forwarding version 2 to ${addr[inf3]}:5851 failed" "$work/ct-inf1")
at=$(awk '{print $8}' <<<"$line")
at=${at%:}
ms=$(( ${at/./} - killed_at / 1000 ))
ct_bound_ms=5500 # the cut-through's send step, then the store-and-forward attempt: 2 x 2000 ms, plus 1.5 s slack
if [[ -n $line && $ms -ge 0 && $ms -le $ct_bound_ms ]]; then
  pass "inf1 reported forwarding to the killed inf3 failed in ${ms} ms (bound ${ct_bound_ms} ms)" "$line"
else
  failed "inf1 reported forwarding to the killed inf3 failed within ${ct_bound_ms} ms" \
    "${ms:-?} ms: ${line:-nothing}; $(cat "$work/ct-inf1")"
fi
spawn inf3 recv "${addr[inf3]}" 5851 4 7 "${big[@]}" "${ct[@]}" >"$work/ct-inf3-restarted" 2>&1
rpid[inf3]=$!
wait_listening inf3 5851
wait "${spid[inf1]}"
check "trainer -> inf1 while inf3 is killed behind it" 0 $? "$work/ct-tx" "^sent 4 versions.*, 0 failed attempts"
wait "${rpid[inf1]}"
check "inf1 received every version, reported inf3, caught it up dense, then cut-through again" 1 $? \
  "$work/ct-inf1" "^received version 4 \(4 published, 0 failed\)" \
  "^forwarded version 3 to ${addr[inf3]}:5851 \(store-and-forward: rlpt.sync.base_mismatch" \
  "^forwarded version 4 to ${addr[inf3]}:5851 \(cut-through\)" "^forwarded version 4 to ${addr[inf2]}:5850 \(cut-through\)"
wait "${rpid[inf2]}"
check "inf2 received every version bit-exact through inf1" 0 $? "$work/ct-inf2" "^received version 4 \(4 published, 0 failed\)"
wait "${rpid[inf3]}"
check "inf3 (restarted) got version 3 dense, version 4 as a delta, bit-exact" 0 $? "$work/ct-inf3-restarted" \
  "^published version 3 \(dense\)" "^published version 4 \(delta from version 3\)" "^received version 4 \(2 published"

phase "6c. a 17 s silent outage: inf1 (listening) and inf2 (connecting to a listening trainer)"
# The path to and from each host drops every packet without a word, as a router does when a
# link beyond it fails: tbf at a few bits per second on the host's eth0 and on its bridge port,
# with the neighbours' MACs pinned so that no ARP failure (whose ICMP would reset TCP's backoff)
# gives it away. With tcp_options::dead_peer_timeout (2 s here) each end aborts a connection the
# other host stops acknowledging (TCP_USER_TIMEOUT for data in flight, keepalive probes on an
# idle one), so when the path is back the next attempt connects afresh. A kept connection would
# wait for its retransmission timer, which doubles to 6-13 s between tries over such an outage,
# and the idle receiver on inf2 would sit on a connection the trainer had given up.
lo=("${secret[@]}" --step-timeout-ms 2000 --commit-timeout-ms 2000 --dead-peer-ms "${dead_peer_ms:-2000}")
lo_tx=(--retries 60 --retry-pause-ms 200 --version-pause-ms 3000)
mac() { nx "$1" cat /sys/class/net/eth0/address; }
for h in inf1 inf2; do
  nx trainer ip neigh replace "${addr[$h]}" lladdr "$(mac "$h")" dev eth0 nud permanent
  nx "$h" ip neigh replace "${addr[trainer]}" lladdr "$(mac trainer)" dev eth0 nud permanent
done
blackhole=(tbf rate 8bit burst 1600 limit 1)
spawn inf1 recv "${addr[inf1]}" 5860 3 7 --listen "${lo[@]}" --timeout-s 55 >"$work/lo-inf1" 2>&1
rpid[inf1]=$!
spawn trainer send "${addr[trainer]}" 5861 3 7 --listen "${lo[@]}" "${lo_tx[@]}" >"$work/lo-tx-inf2" 2>&1
spid[inf2]=$!
wait_listening inf1 5860
wait_listening trainer 5861
spawn inf2 recv "${addr[trainer]}" 5861 3 7 "${lo[@]}" --timeout-s 55 >"$work/lo-inf2" 2>&1
rpid[inf2]=$!
spawn trainer send "${addr[inf1]}" 5860 3 7 "${lo[@]}" "${lo_tx[@]}" >"$work/lo-tx-inf1" 2>&1
spid[inf1]=$!
both_v1() { reported "$work/lo-inf1" "^published version 1 " && reported "$work/lo-inf2" "^published version 1 "; }
wait_until 20 both_v1 || failed "inf1 and inf2 published version 1" "$(cat "$work/lo-inf1" "$work/lo-inf2")"
for h in inf1 inf2; do # (their ports carry phase 2's 100 Mbit/s tbf)
  ip netns exec "$lan" tc qdisc change dev "${port[$h]}" root "${blackhole[@]}"
  nx "$h" tc qdisc add dev eth0 root "${blackhole[@]}"
done
sleep 17
for h in inf1 inf2; do
  ip netns exec "$lan" tc qdisc change dev "${port[$h]}" root tbf rate 100mbit burst 32kb latency 50ms
  nx "$h" tc qdisc del dev eth0 root
done
up_at=$(now_us)
lo_bound_ms=5000 # an attempt's connect (2 s), the retry pause, the update itself: under 3 s, plus slack
for h in inf1 inf2; do
  wait_until 30 reported "$work/lo-$h" "^published version 2 "
  line=$(grep -m1 "^published version 2 " "$work/lo-$h")
  at=$(awk '{print $NF}' <<<"$line")
  ms=$(( ${at/./} - up_at / 1000 ))
  if [[ -n $line && $ms -le $lo_bound_ms ]]; then
    pass "$h published version 2 ${ms} ms after its path came back (bound ${lo_bound_ms} ms)" "$line"
  else
    failed "$h published version 2 within ${lo_bound_ms} ms of its path coming back" \
      "${ms:-?} ms: ${line:-nothing}; $(cat "$work/lo-$h" "$work/lo-tx-$h")"
  fi
done
for h in inf1 inf2; do
  wait "${spid[$h]}"
  check "trainer -> $h across a 17 s silent outage" 0 $? "$work/lo-tx-$h" "^sent 3 versions"
  wait "${rpid[$h]}"
  check "$h ends on version 3 bit-exact after the outage" 0 $? "$work/lo-$h" "^received version 3 \(3 published"
  nx trainer ip neigh del "${addr[$h]}" dev eth0
  nx "$h" ip neigh del "${addr[trainer]}" dev eth0
done

phase "7. the UCX transport: trainer -> inf1..inf4, an intruder, a chain, a host killed mid-update"
ucx=(--transport ucx)
if ! "$node" send 127.0.0.1 1 1 7 "${ucx[@]}" --step-timeout-ms 1 2>&1 | grep -q "without component ucx"; then
  for h in "${infs[@]}"; do ip netns exec "$lan" tc qdisc del dev "${port[$h]}" root 2>/dev/null; done
  recv_all 5900 3 ucx "${model[@]}" "${ucx[@]}"
  run intruder send "${addr[inf1]}" 5900 1 99 "${model[@]}" --step-timeout-ms 2000 --secret-env RLPT_OTHER_SECRET \
    "${ucx[@]}" >"$work/ucx-intruder" 2>&1
  check "UCX: intruder with another secret -> inf1" 1 $? "$work/ucx-intruder" "rlpt.sync.auth"
  send_all 5900 3 ucx "${model[@]}" "${ucx[@]}"
  for h in "${infs[@]}"; do
    wait "${spid[$h]}"
    check "UCX: trainer -> $h" 0 $? "$work/ucx-tx-$h" "^sent 3 versions"
  done
  for h in "${infs[@]}"; do
    wait "${rpid[$h]}"
    check "UCX: $h received every version bit-exact" 0 $? "$work/ucx-$h" "^received version 3 \(3 published, 0 failed\)"
  done
  grep -q "refused peers [1-9]" "$work/ucx-inf1" && pass "UCX: inf1 refused the intruder" "$(tail -1 "$work/ucx-inf1")" ||
    failed "UCX: inf1 refused the intruder" "$(cat "$work/ucx-inf1")"
  # A chain over UCX.
  spawn inf2 recv "${addr[inf2]}" 5911 3 7 "${model[@]}" --listen "${secret[@]}" --timeout-s 40 "${ucx[@]}" \
    >"$work/ucx-chain-inf2" 2>&1
  rpid[inf2]=$!
  spawn inf1 forward "${addr[inf1]}" 5910 3 7 "${model[@]}" --listen "${secret[@]}" --timeout-s 40 "${ucx[@]}" \
    --to "${addr[inf2]}:5911" >"$work/ucx-chain-inf1" 2>&1
  rpid[inf1]=$!
  wait_listening inf2 5911
  wait_listening inf1 5910
  run trainer send "${addr[inf1]}" 5910 3 7 "${model[@]}" "${secret[@]}" "${ucx[@]}" >"$work/ucx-chain-tx" 2>&1
  check "UCX: trainer -> inf1 (forwarding)" 0 $? "$work/ucx-chain-tx" "^sent 3 versions"
  wait "${rpid[inf1]}"
  check "UCX: inf1 received and forwarded every version" 0 $? "$work/ucx-chain-inf1" \
    "^received version 3 \(3 published, 0 failed\)" "forwarded .* 0 failures"
  wait "${rpid[inf2]}"
  check "UCX: inf2 received every version bit-exact through inf1" 0 $? "$work/ucx-chain-inf2" "^received version 3 \(3 published"
  # inf3's host killed while a large update is in flight to it and to inf4.
  for h in inf3 inf4; do
    spawn "$h" recv "${addr[$h]}" 5920 2 7 "${big[@]}" --listen "${secret[@]}" --timeout-s 40 "${ucx[@]}" \
      >"$work/ucx-kill-$h" 2>&1
    rpid[$h]=$!
  done
  for h in inf3 inf4; do wait_listening "$h" 5920; done
  ip netns exec "$lan" tc qdisc add dev "${port[inf3]}" root tbf rate 24mbit burst 32kb latency 50ms
  for h in inf3 inf4; do
    spawn trainer send "${addr[$h]}" 5920 2 7 "${big[@]}" "${secret[@]}" "${ucx[@]}" --step-timeout-ms 2000 \
      --commit-timeout-ms 2000 >"$work/ucx-kill-tx-$h" 2>&1
    spid[$h]=$!
  done
  wait_until 20 reported "$work/ucx-kill-inf3" "^published version 1 " ||
    failed "UCX: inf3 published version 1" "$(cat "$work/ucx-kill-inf3")"
  sleep 0.2 # version 2 under way (about a second through inf3's 24 Mbit/s downlink)
  disown "${rpid[inf3]}"
  kill_host inf3
  killed_at=$(now_us)
  wait "${spid[inf3]}"
  rc=$?
  line=$(grep -m1 "^version 2 attempt 1 failed" "$work/ucx-kill-tx-inf3")
  at=$(awk '{print $7}' <<<"$line")
  ms=$(( ${at/./} - killed_at / 1000 ))
  if [[ $rc -ne 0 && $line =~ (rlpt.sync.peer_lost|rlpt.sync.timeout) && $ms -ge 0 && $ms -le $bound_ms ]]; then
    pass "UCX: the sender to inf3 reported its host killed in ${ms} ms (bound ${bound_ms} ms)" "$line"
  else
    failed "UCX: the sender to inf3 reported its host killed within ${bound_ms} ms" \
      "exit $rc, ${ms:-?} ms: ${line:-nothing}; $(cat "$work/ucx-kill-tx-inf3")"
  fi
  wait "${spid[inf4]}"
  check "UCX: trainer -> inf4 while inf3 is killed" 0 $? "$work/ucx-kill-tx-inf4" "^sent 2 versions"
  wait "${rpid[inf4]}"
  check "UCX: inf4 received every version bit-exact" 0 $? "$work/ucx-kill-inf4" "^received version 2 \(2 published, 0 failed\)"
else
  echo "skipped: sync_node was built without component ucx"
fi

echo "netns cluster: $passed checks passed, $([[ $fail == 0 ]] && echo "none" || echo "some") failed, in $(elapsed) s"
exit $fail
