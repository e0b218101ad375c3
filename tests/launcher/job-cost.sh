#!/usr/bin/env bash
# What a job on a session costs each host (issue 20): a session of H loopback pseudo-hosts (one
# greedyd each, through a fake remote shell on this machine, as tests/launcher/tasks-bench.sh
# does), then J jobs of `hostname`, one rank per host, for each wire-up family served (--pmi;
# not charm, which fails a program that never connects to it).
# Prints, per family, the CPU milliseconds per host per job of the jobs' own process trees (the
# greedyd each session agent starts per job, its guard and the rank: the agents' children's
# times, which the kernel adds up exactly) and of the rest (the session's agents and process,
# the clients), and the wall per job. No network delay and no ssh: this is the per-job work
# that a session's agents would no longer do if they served the jobs themselves. ≈ 40 s.
# usage: tests/launcher/job-cost.sh [--hosts H] [--jobs J] [--pmi "none pmi1 pmix auto"]
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
hosts=64 jobs=20 families="none pmi1 pmix auto"
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --pmi) families=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--jobs J] [--pmi FAMILIES]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench job-cost
session=$("$BIN" --rsh "$work/localsh" -H "$(loopback_hosts "$hosts" 1)" --start-session \
  --idle-timeout 600 </dev/null | sed -n 's/^export GREEDY_SESSION=//p')
[[ -S $session ]] || fail "no session on $hosts hosts"
# The session's agents: their launch token names the session's process.
serve=$(grep -lzx "GREEDY_SESSION_SERVE=$session" /proc/[0-9]*/environ 2>/dev/null | head -1 | cut -d/ -f3) ||
  true
[[ -n $serve ]] || fail "no session process"
agents=$(pgrep -f "greedyd --launch greedy$serve[.]" | tr '\n' ' ') || true
(($(wc -w <<<"$agents") == hosts)) || fail "found $(wc -w <<<"$agents") of $hosts agents"

tck=$(getconf CLK_TCK)
# Clock ticks: the agents' children (the jobs' trees, as each agent reaps them), and the rest.
trees() { for a in $agents; do awk '{print $16 + $17}' "/proc/$a/stat"; done | awk '{s += $1} END {print s}'; }
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

echo "| --pmi | jobs' trees, CPU ms per host per job | the rest, CPU ms per job | wall ms per job |"
echo "|---|---|---|---|"
for pmi in $families; do
  sleep 1
  c0=$(trees) b0=$(busy) t0=$(ms)
  for ((j = 0; j < jobs; j++)); do
    got=$(GREEDY_SESSION=$session "$BIN" --pmi "$pmi" -n "$hosts" --ppn 1 hostname </dev/null | wc -l)
    ((got == hosts)) || fail "--pmi $pmi: $got of $hosts ranks answered"
  done
  t1=$(ms)
  sleep 1 # the last job's trees are reaped once their bye is read
  c1=$(trees) b1=$(busy)
  awk -v p="$pmi" -v c=$((c1 - c0)) -v b=$((b1 - b0)) -v t=$((t1 - t0)) -v j="$jobs" -v h="$hosts" -v k="$tck" \
    'BEGIN { printf "| %s | %.1f | %.0f | %.0f |\n", p, c * 1000 / k / j / h, (b - c) * 1000 / k / j, t / j }'
done
