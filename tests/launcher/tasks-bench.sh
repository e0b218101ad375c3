#!/usr/bin/env bash
# Task streams (issue 20): N tasks of `/bin/true` and of `sleep 0.01` through greedyrun --tasks
# on H loopback pseudo-hosts of S slots (one greedyd each, started through a fake remote shell
# on this machine, as tests/launcher/pmix-scale.sh does), fresh and on a running session,
# against the machine's own ceiling: `xargs -P H*S sh -c` on the same lines (a local
# fork/exec loop with as many tasks at once as greedy's slots).
# Everything shares this machine's cores: tasks/s here are the CPU's, not the tree's.
# Prints one markdown row per (workload, runner): median wall of R runs, tasks/s, ratio to the
# ceiling, and for a fresh greedyrun its peak memory (VmHWM, polled): flat in N, since it reads
# a line only when a slot is free.
# usage: tests/launcher/tasks-bench.sh [--tasks N] [--hosts H] [--slots S] [--reps R]
#        [--workload CMD] (default: both /bin/true and "sleep 0.01")
#        tests/launcher/tasks-bench.sh --memory-check [--tasks N]: the test of scripts/test:
#        streams of N/10 and N tasks of `:` through a fresh greedyrun, every task reported once,
#        and its peak memory for N no more than 1 MB above that for N/10.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ntasks=10000 hosts=16 slots=2 reps=3 workloads=(/bin/true "sleep 0.01") memcheck=0
while (($#)); do
  case $1 in
    --tasks) ntasks=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --workload) workloads=("$2"); shift 2 ;;
    --memory-check) memcheck=1; shift ;;
    *) echo "usage: $0 [--tasks N] [--hosts H] [--slots S] [--reps R] [--workload CMD]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench tasks-bench
list=$(loopback_hosts "$hosts" "$slots")
width=$((hosts * slots))
# The largest VmHWM (kB) of process PID, polled until it exits.
peak() {
  local hwm=0 v
  while v=$(awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null) && [[ -n $v ]]; do
    hwm=$v
    sleep 0.2
  done
  echo "$hwm"
}

if ((memcheck)); then
  declare -A kb=()
  for n in $((ntasks / 10)) "$ntasks"; do
    awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) print ":" }' >"$work/tasks"
    "$BIN" --rsh "$work/localsh" -H "$list" --progress 0 --tasks "$work/tasks" --results "$work/r.json" &
    kb[$n]=$(peak $!)
    wait $! || fail "a stream of $n tasks failed"
    [[ $(wc -l <"$work/r.json") == "$n" ]] || fail "$n tasks: not every task reported once"
    echo "tasks-bench: $n tasks: greedyrun's VmHWM ${kb[$n]} kB"
  done
  ((kb[$ntasks] <= kb[$((ntasks / 10))] + 1024)) ||
    fail "greedyrun's memory grows with the stream: ${kb[$((ntasks / 10))]} kB for $((ntasks / 10)) tasks, ${kb[$ntasks]} kB for $ntasks"
  echo "tasks-bench: memory-check: PASS (flat from $((ntasks / 10)) to $ntasks tasks)"
  exit 0
fi

echo "| workload | runner | median s | tasks/s | of the ceiling | front end VmHWM |"
echo "|---|---|---|---|---|---|"
for workload in "${workloads[@]}"; do
  awk -v n="$ntasks" -v w="$workload" 'BEGIN { for (i = 0; i < n; i++) print w }' >"$work/tasks"
  declare -A wall=()
  for runner in ceiling fresh session; do
    : >"$work/times"
    hwm=""
    for ((r = 0; r < reps; r++)); do
      if [[ $runner == session && -z $session ]]; then
        session=$("$BIN" --rsh "$work/localsh" -H "$list" --progress 0 --start-session | sed -n 's/^export GREEDY_SESSION=//p')
        [[ -n $session ]] || fail "the session did not start"
      fi
      t0=$(ms)
      case $runner in
        ceiling) xargs -d '\n' -P "$width" -n 1 sh -c <"$work/tasks" ;;
        fresh)
          "$BIN" --rsh "$work/localsh" -H "$list" --progress 0 --tasks "$work/tasks" --results "$work/r.json" &
          hwm=$(peak $!)
          wait $!
          ;;
        session) GREEDY_SESSION=$session "$BIN" --tasks "$work/tasks" --results "$work/r.json" ;;
      esac || fail "$runner: $workload failed"
      t1=$(ms)
      [[ $runner == ceiling ]] || [[ $(wc -l <"$work/r.json") == "$ntasks" ]] || fail "$runner: not every task reported"
      echo $((t1 - t0)) >>"$work/times"
    done
    wall[$runner]=$(median <"$work/times")
    rate=$(awk -v n="$ntasks" -v ms="${wall[$runner]}" 'BEGIN { printf "%.0f", n / (ms / 1000) }')
    of=$(awk -v a="${wall[ceiling]}" -v b="${wall[$runner]}" 'BEGIN { printf "%.0f %%", 100 * a / b }')
    label=$([[ $runner == ceiling ]] && echo "xargs -P $width (this machine)" || echo "greedyrun --tasks, $runner ($hosts hosts x $slots)")
    mem=$([[ -n $hwm ]] && awk -v k="$hwm" 'BEGIN { printf "%.1f MB", k / 1024 }' || echo "")
    echo "| $ntasks x \`$workload\` | $label | $(awk -v ms="${wall[$runner]}" 'BEGIN { printf "%.2f", ms / 1000 }') | $rate | $of | $mem |"
  done
done
