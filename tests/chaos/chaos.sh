#!/usr/bin/env bash
# Faults injected into task streams on the emulated cluster, with figures (docs/reliability.md).
#
# Each case runs a stream of TASKS short tasks (2 slots per host, --results) over ssh on every
# host and injects one fault at a random point past the first results, on a host of its own:
#   dead-host     before the launch, every process of a host's namespace is killed (its sshd
#                 too: the host refuses connections, as a crashed node's address would)
#   host-killed   mid-stream, every process of a host's namespace is killed
#   agent-stopped mid-stream, a host's agent is SIGSTOPped for STOP seconds, then continued
#   agent-lost    the same for longer than --lost-after (STOP + 5 s): lost by name, its tasks
#                 run elsewhere; continued, it finds its parent gone and ends (no rejoining)
#   link-cut      mid-stream, every packet to and from a host is dropped (`testcluster impair
#                 --cut`): its parent loses it after --lost-after, and it ends its own tasks
#   lossy         a whole stream with a quarter of the hosts dropping 5 % of the packets they
#                 receive and holding each up to 200 ms more: nothing lost, only slower
#   front-killed  mid-stream, greedyrun is SIGKILLed; then `--resume RESULTS` runs the rest
#   mpi-wireup    an Open MPI job (2 ranks a host, up to 32 hosts) waits in its wire-up for a rank that sleeps
#                 before MPI_Init; that rank's host is killed: the job ends naming it
#   mpi-running   an Open MPI job past MPI_Init; a host is killed: the job ends naming it
#   session       a session's host is killed while a client's stream runs on it; the stream
#                 ends well, a second stream runs on the hosts left
#   idle-session  a session's host is killed while no client is there; the next stream is
#                 told (from 1 s after) and runs on the hosts left, the session ends clean
# The launch tree is binomial (at these sizes the default greedy tree is flat over ssh, so a
# lost host would have no subtree to heal). For each case one row: seconds from the fault
# until the user is told (the first stderr line naming the host), whether it names the right
# host, how many hosts were named lost (one, unless hosts it had started were cut off with it),
# the exit code, processes of the stream left on any host once it ended (must be 0),
# tasks reported twice or never over the run (and its resume; both must be 0), and whether
# the stream went on to its end (a job: that it ended, failing). Any of those wrong
# fails the script.
#
# usage: tests/chaos/chaos.sh [--hosts H] [--tasks N] [--stop SECS] [--seed S]
#   defaults 16 hosts, 400 tasks, STOP 10 s (the short run of .ci/run); the long run is
#   --hosts 256 --tasks 5000 --stop 30.
set -euo pipefail

TAG=chaos
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
hosts=16 ntasks=400 stop=10 seed=$$
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --tasks) ntasks=$2; shift 2 ;;
    --stop) stop=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--tasks N] [--stop SECS] [--seed S]" >&2; exit 2 ;;
  esac
done
((hosts >= 8)) || fail "--hosts $hosts: at least 8 (each case has a host of its own)"
lost=$((stop + 5)) # --lost-after: a stop of STOP s is slow, one of `lost` s loses the host
RANDOM=$seed
need_root
need_shared_target
build -p greedy-launcher
cluster_up --nodes "$hosts"
eval "$("$TC" env)"
wait_sshd "$hosts"
WORK=$GREEDY_TC_SCRATCH/chaos
mkdir -p "$WORK"
cd "$WORK"
MARK=chaos$$
for ((i = 1; i <= ntasks; i++)); do echo ": $MARK; sleep 0.0$((RANDOM % 9 + 1)); echo task $i"; done >tasks
TREE=(--ppn 2 --rsh ssh --topology binomial --timeout 20 --lost-after "$lost" --progress 0)
GR=("$BIN/greedyrun" --hosts "n[1-$hosts]" "${TREE[@]}" --tasks tasks)

# The agent of this stream on host $1, once it runs (up to 20 s: the launch may not have
# reached the host yet).
agent_on() {
  local p
  for _ in $(seq 200); do
    for p in $(ip netns pids "gtc-$1"); do
      [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") == "$BIN/greedyd --launch "* ]] && echo "$p" && return
    done
    sleep 0.1
  done
}
# The stream's processes left anywhere: agents, guards, tasks, remote shell clients; each
# named in $WORK/left.
leftovers() {
  local p cmd n=0
  : >"$WORK/left"
  for p in $(pgrep -f "greedyd|$MARK" || true); do
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
    if [[ $cmd == *"$BIN/greedyd"* || $cmd == *"$MARK"* ]] && [[ $cmd != *pgrep* ]]; then
      n=$((n + 1))
      echo "$p $cmd" >>"$WORK/left"
    fi
  done
  echo "$n"
}
# Waits up to --lost-after + 15 s (a host cut off ends its tasks once its parent has been
# silent that long) for no leftovers; prints how many are left.
settle() {
  local left
  for _ in $(seq $(((lost + 15) * 5))); do
    left=$(leftovers)
    ((left == 0)) && break
    sleep 0.2
  done
  echo "$left"
}
# Tasks with no result and tasks with more than one, in results file $1.
twice_never() {
  python3 - "$1" "$ntasks" <<'EOF'
import collections, json, sys
seen = collections.Counter(json.loads(l)["task"] for l in open(sys.argv[1]) if l.strip())
n = int(sys.argv[2])
print(sum(1 for t in range(1, n + 1) if seen[t] > 1), sum(1 for t in range(1, n + 1) if seen[t] == 0))
EOF
}
# Starts the stream (more greedyrun options in "$@") in the background, stderr lines stamped
# with the time they came; PID and ERR set.
start() {
  local name=$1
  shift
  ERR=$WORK/$name.err
  "${GR[@]}" "$@" </dev/null >"$WORK/$name.out" 2> >(while IFS= read -r l; do echo "$(ms) $l"; done >"$ERR") &
  PID=$!
}
# Waits until results file $1 has $2 lines (up to 60 s).
results_reach() {
  for _ in $(seq 600); do
    local n
    n=$(grep -c . "$1" 2>/dev/null || true)
    ((${n:-0} >= $2)) && return 0
    sleep 0.1
  done
  fail "$1: fewer than $2 results after 60 s"
}
# A point past the first results: between 10 % and 60 % of the tasks.
some_point() { echo $((ntasks / 10 + RANDOM % (ntasks / 2))); }
# Seconds from $1 (ms) until the first stamped stderr line after it naming host $2; "never"
# if none.
told_after() {
  awk -v t0="$1" -v h="$2" '$1 >= t0 && $0 ~ ("[^a-z0-9]" h "([^0-9]|$)") { printf "%.2f", ($1 - t0) / 1000; found = 1; exit }
    END { if (!found) print "never" }' "$ERR"
}
# Hosts killed by the cases before: every later stream names them lost at its start.
DEAD=" "
# The hosts the stamped stderr names lost, but those of DEAD: "N" or "N (C cut off)", where
# the C cut off were started through a lost host and went with it.
lost_count() {
  local hosts cut
  # One match per host: a session's line to a new stream names several, split by "; ".
  hosts=$(grep -o "host n[0-9]* [^;]*lost: [^;]*" "$ERR" | awk -v dead="$DEAD" 'index(dead, " " $2 " ") == 0')
  cut=$(grep -c "lost: cut off" <<<"$hosts" || true)
  hosts=$(awk '{print $2}' <<<"$hosts" | sort -u | grep -c . || true)
  if ((cut > 0)); then echo "$hosts ($cut cut off)"; else echo "$hosts"; fi
}
ROWS=()
# row CASE HOST TOLD RC LEFT TWICE NEVER WENT_ON: one row of figures, each checked. TOLD
# "not told…" is a host slow, not lost: then none may be named lost. TWICE and NEVER are "-"
# for a job (no tasks); WENT_ON "ended…" for a job, which must end at a lost host.
row() {
  local named=yes nlost
  nlost=$(lost_count)
  [[ $3 == never ]] && named=no
  [[ $3 == "not told"* && $nlost != 0 ]] && named="no: $nlost lost"
  ROWS+=("| $1 | $2 | $3 | $named | $nlost | $4 | $5 | $6 | $7 | $8 |")
  echo "chaos: $1 on $2: told after $3 s, $nlost host(s) named lost, exit $4, left $5, twice $6, never $7, went on: $8" >&2
  [[ $named == yes && $5 == 0 && $6 =~ ^(0|-)$ && $7 =~ ^(0|-)$ && $8 =~ ^(yes|ended) ]] ||
    fail "$1: $(tail -5 "$ERR"); left: $(cat "$WORK/left")"
}

finish() { # finish NAME: waits for the stream, which must end 0; RC, LEFT, TWICE, NEVER
  set +e
  wait "$PID"
  RC=$?
  set -e
  ((RC == 0)) || fail "$1: exit $RC: $(tail -5 "$ERR")"
  # (Also gives the stamping loop time to write the last lines.) A session's agents stay: what
  # is left is counted once it has ended.
  if [[ -z ${GREEDY_SESSION:-} ]]; then LEFT=$(settle); else sleep 0.5; fi
  read -r TWICE NEVER < <(twice_never "$WORK/$1.json")
}

# dead-host: the host is gone before the launch; its part of the tree is started around it.
victim=n$((2 + RANDOM % (hosts / 4)))
kill_host "$victim"
t0=$(ms)
start dead-host --results "$WORK/dead-host.json"
finish dead-host
row dead-host "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" "$TWICE" "$NEVER" yes
DEAD+="$victim "

# host-killed: mid-stream; its tasks run again elsewhere.
victim=n$((hosts / 4 + 2 + RANDOM % (hosts / 4)))
start host-killed --results "$WORK/host-killed.json"
results_reach "$WORK/host-killed.json" "$(some_point)"
t0=$(ms)
kill_host "$victim"
finish host-killed
row host-killed "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" "$TWICE" "$NEVER" yes
DEAD+="$victim "

# stopped NAME SECS: the stream NAME, mid-way the agent on $victim SIGSTOPped for SECS (from
# t0), then continued; waits for the stream's end (finish).
stopped() {
  local agent
  start "$1" --results "$WORK/$1.json"
  results_reach "$WORK/$1.json" "$(some_point)"
  agent=$(agent_on "$victim")
  [[ -n $agent ]] || fail "$1: no agent found on $victim"
  t0=$(ms)
  kill -STOP "$agent"
  sleep "$2"
  kill -CONT "$agent"
  finish "$1"
}

# agent-stopped: the agent cannot report for STOP seconds; nothing is lost or run twice.
victim=n$((hosts / 2 + 2 + RANDOM % (hosts / 4)))
stopped agent-stopped "$stop"
# A stopped agent is slow, not lost: nobody is told, and the stream goes on.
row agent-stopped "$victim" "not told (slow, not lost)" "$RC" "$LEFT" "$TWICE" "$NEVER" yes

# agent-lost: stopped for longer than --lost-after: lost, its tasks run elsewhere; once
# continued it finds its parent gone and ends with its tasks (it cannot rejoin).
victim=n$((hosts / 2 + 2 + RANDOM % (hosts / 4)))
stopped agent-lost $((lost + 3))
row "agent-lost ($((lost + 3)) s)" "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" "$TWICE" "$NEVER" yes

# link-cut: no packet reaches the host or leaves it; both sides of its edge hear nothing.
victim=n$((hosts / 2 + 2 + RANDOM % (hosts / 4)))
start link-cut --results "$WORK/link-cut.json"
results_reach "$WORK/link-cut.json" "$(some_point)"
# A host the launch has reached (at 512 hosts it may not have yet: cut before its remote
# shell connects, it would only never join).
[[ -n $(agent_on "$victim") ]] || fail "link-cut: no agent found on $victim"
t0=$(ms)
"$TC" impair "$victim" --cut
finish link-cut # LEFT counted while the link is still cut: the host ended its own tasks
row link-cut "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" "$TWICE" "$NEVER" yes
"$TC" mend

# lossy: a quarter of the hosts lose 5 % of the packets they receive, the rest wait up to
# 200 ms more; against the same stream on clean links just before.
t0=$(ms)
start clean --results "$WORK/clean.json"
finish clean
clean_s=$(awk -v t="$(($(ms) - t0))" 'BEGIN { printf "%.1f", t / 1000 }')
bad=()
for ((i = hosts / 2 + 2; i < 3 * hosts / 4 + 2; i++)); do bad+=("n$i"); done
"$TC" impair "${bad[@]}" --loss 5 --jitter 200
t0=$(ms)
start lossy --results "$WORK/lossy.json"
finish lossy
lossy_s=$(awk -v t="$(($(ms) - t0))" 'BEGIN { printf "%.1f", t / 1000 }')
"$TC" mend
row "lossy (5 %, 0-200 ms)" "${bad[0]}..${bad[-1]}" "not told (slow, not lost)" "$RC" "$LEFT" "$TWICE" "$NEVER" "yes ($lossy_s s; clean $clean_s s)"

# front-killed: greedyrun dies; every host ends the stream's processes; --resume runs the rest.
start front-killed --results "$WORK/front-killed.json"
results_reach "$WORK/front-killed.json" "$(some_point)"
t0=$(ms)
kill -KILL "$PID"
wait "$PID" 2>/dev/null || true
LEFT=$(settle)
gone_s=$(awk -v t="$(($(ms) - t0))" 'BEGIN { printf "%.1f", t / 1000 }')
start front-resumed --resume "$WORK/front-killed.json"
set +e
wait "$PID"
RC=$?
set -e
((RC == 0)) || fail "front-killed: the resumed run exited $RC: $(tail -5 "$ERR")"
read -r TWICE NEVER < <(twice_never "$WORK/front-killed.json")
((LEFT == 0)) || fail "front-killed: $LEFT processes left $gone_s s after greedyrun was killed"
row front-killed greedyrun "$gone_s (all gone)" "$RC" "$(settle)" "$TWICE" "$NEVER" "yes (resumed)"

# The MPI cases: Open MPI over greedy's PMIx server, 2 ranks on each of the first 32 hosts
# still up (more Open MPI ranks than that do not fit this machine's memory and 2 cores).
mpicc.openmpi -O1 -o "$WORK/wireup" "$ROOT/tests/mpi/wireup.c"
# The first 32 hosts not killed yet, as a host list.
alive_hosts() {
  local i list=()
  for ((i = 1; i <= hosts && ${#list[@]} < 32; i++)); do
    [[ $DEAD == *" n$i "* ]] || list+=("n$i")
  done
  local IFS=,
  echo "${list[*]}"
}
JOB_HOSTS=$(alive_hosts)
IFS=, read -ra job_hosts <<<"$JOB_HOSTS"
# mpi_job NAME ARGS…: the job in the background (PID, ERR), ranks tagged with MARK.
mpi_job() {
  local name=$1
  shift
  ERR=$WORK/$name.err
  "$BIN/greedyrun" --hosts "$JOB_HOSTS" "${TREE[@]}" -- env OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader,tcp "$WORK/wireup" "$@" "$MARK" </dev/null >"$WORK/$name.out" \
    2> >(while IFS= read -r l; do echo "$(ms) $l"; done >"$ERR") &
  PID=$!
}
# Waits until $1 of the job's ranks run (up to 60 s).
ranks_run() {
  for _ in $(seq 600); do
    (($(pgrep -fc "^$WORK/wireup .*$MARK" || true) >= $1)) && return 0
    sleep 0.1
  done
  fail "fewer than $1 ranks after 60 s"
}
# end_job NAME: waits for the job, which must end 125 (a host lost, whether greedyrun or the
# ranks' wire-up hears of it first); RC, LEFT.
end_job() {
  set +e
  wait "$PID"
  RC=$?
  set -e
  ((RC == 125)) || fail "$1: exit $RC, not 125: $(tail -5 "$ERR")"
  LEFT=$(settle)
}

# mpi-wireup: the others wait in the wire-up for the sleeping rank, whose host dies. The
# victims of the MPI cases are in the first half of the hosts, the sessions' in the last.
k=$((RANDOM % (${#job_hosts[@]} / 2)))
victim=${job_hosts[k]}
mpi_job mpi-wireup "sleep-before-init=$((2 * k)):60"
ranks_run $((2 * ${#job_hosts[@]}))
sleep 1
t0=$(ms)
kill_host "$victim"
end_job mpi-wireup
row mpi-wireup "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" - - "ended"
DEAD+="$victim "
JOB_HOSTS=$(alive_hosts)
IFS=, read -ra job_hosts <<<"$JOB_HOSTS"

# mpi-running: every rank past MPI_Init (each says so), then a host dies.
victim=${job_hosts[RANDOM % (${#job_hosts[@]} / 2)]}
mpi_job mpi-running sleep-after-init=60
for ((i = 0; i < 600; i++)); do
  (($(grep -c initialised "$WORK/mpi-running.out" || true) >= 2 * ${#job_hosts[@]})) && break
  sleep 0.1
done
((i < 600)) || fail "mpi-running: not every rank past MPI_Init after 60 s: $(tail -5 "$ERR")"
t0=$(ms)
kill_host "$victim"
end_job mpi-running
row mpi-running "$victim" "$(told_after "$t0" "$victim")" "$RC" "$LEFT" - - "ended"
DEAD+="$victim "

# session: a session loses a host under a client's stream, and serves the next stream.
GS=("$BIN/greedyrun" --progress 0)
eval "$("$BIN/greedyrun" --hosts "n[1-$hosts]" "${TREE[@]}" --start-session)"
at_exit '"$BIN/greedyrun" --end-session >/dev/null 2>&1'
GR=("${GS[@]}" --tasks tasks)
victim=n$((3 * hosts / 4 + 2 + RANDOM % (hosts / 4 - 2)))
start session --results "$WORK/session.json"
results_reach "$WORK/session.json" "$(some_point)"
t0=$(ms)
kill_host "$victim"
set +e
wait "$PID"
RC=$?
set -e
((RC == 0)) || fail "session: the stream exited $RC: $(tail -5 "$ERR")"
read -r TWICE NEVER < <(twice_never "$WORK/session.json")
told=$(told_after "$t0" "$victim")
start session-after --results "$WORK/session-after.json"
finish session-after
read -r t2 n2 < <(twice_never "$WORK/session-after.json")


# idle-session: a host dies while no client is there; the next stream is told, runs on the
# hosts left, and the session ends clean.
victim2=n$((3 * hosts / 4 + 2 + RANDOM % (hosts / 4 - 2)))
[[ $victim2 == "$victim" ]] && victim2=n$((3 * hosts / 4 + 1))
t0=$(ms)
kill_host "$victim2"
sleep 1
start idle-session --results "$WORK/idle-session.json"
finish idle-session
"$BIN/greedyrun" --end-session >/dev/null
LEFT=$(settle) # the session's agents too, now that it has ended
told2=$(told_after "$t0" "$victim2")
idle_err=$ERR
ERR=$WORK/session.err
row session "$victim" "$told" 0 "$LEFT" "$((TWICE + t2))" "$((NEVER + n2))" "yes (next stream ran)"
DEAD+="$victim "
ERR=$idle_err
row idle-session "$victim2" "$told2" "$RC" "$LEFT" "$TWICE" "$NEVER" "yes (told, ran, ended clean)"

echo "| fault | host | told after s | named | hosts named lost | exit | left | twice | never | went on |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
pass "$hosts hosts, $ntasks tasks a case, seed $seed: every fault named, nothing left, no task lost or repeated"
