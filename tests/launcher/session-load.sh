#!/usr/bin/env bash
# A session serving many jobs in a row: memory and file descriptors of every process it keeps
# (the session's own greedyrun and each host's agent) must stay flat (docs/reliability.md).
#
# Starts a session on HOSTS loopback pseudo-hosts (a fake remote shell runs each agent here),
# runs JOBS jobs of `true` on all its slots one after the other (`greedyrun -n SLOTS true`,
# GREEDY_SESSION set), samples each kept process's VmRSS and open descriptors every JOBS/10
# jobs, and prints one row per sample. Fails if a job fails, if any process's descriptors
# grew by more than 2 from the sample after the first tenth of the jobs to the last, or its
# VmRSS by more than 25 % and 2 MB (the allocator's pools settle over the first jobs).
#
# usage: tests/launcher/session-load.sh [--jobs N] [--hosts H] [--pmi MODE]   (defaults 1000,
#   4 and auto, every family served; the long run is --jobs 10000). Under auto, libpmix
#   (Debian's 4.2) keeps about 53 kB per job in each host's PMIx server after the job's
#   namespace is deregistered (three hash tables of its job data, found with valgrind's
#   massif: docs/reliability.md), so an agent grows with the jobs; `--pmi pmi1` (what .ci/run
#   runs) keeps libpmix out and checks greedy's own memory.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
jobs=1000 hosts=4 pmi=auto
while (($#)); do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --pmi) pmi=$2; shift 2 ;;
    *) echo "usage: $0 [--jobs N] [--hosts H] [--pmi MODE]" >&2; exit 2 ;;
  esac
done
((jobs >= 10)) || fail "--jobs $jobs: at least 10 (one sample per tenth)"
build -p greedy-launcher
WORK=$(mktemp -d /var/tmp/session-load.XXXXXX)
at_exit 'rm -rf "$WORK"'
trap 'for c in "${AT_EXIT[@]}"; do eval "$c" || true; done' EXIT
. "$ROOT/tests/launcher/loopback.sh"
loopback_session "$WORK" "$hosts" 2
# The session's own process, and its agents (greedyd processes below it).
session=$SESSION_PID
agents=$(pgrep -f "^$BIN/greedyd --launch" | tr '\n' ' ')
(($(wc -w <<<"$agents") == hosts)) || fail "expected $hosts agents, found: $agents"
# One sample: "RSS_KB FDS" per kept process, session first.
sample() {
  local p
  for p in $session $agents; do
    echo "$(awk '/^VmRSS/ {print $2}' "/proc/$p/status") $(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 | wc -l)"
  done | tr '\n' ' '
}
echo "| jobs done | s | session RSS kB, fds | agents' RSS kB, fds |"
echo "|---|---|---|---|"
samples=()
t0=$(ms)
for ((j = 0; j <= jobs; j++)); do
  if ((j % (jobs / 10) == 0)); then
    s=$(sample)
    samples+=("$s")
    read -ra v <<<"$s"
    agent_cols=""
    for ((k = 2; k < ${#v[@]}; k += 2)); do agent_cols+="${v[k]}, ${v[k + 1]}; "; done
    echo "| $j | $((($(ms) - t0) / 1000)) | ${v[0]}, ${v[1]} | ${agent_cols%; } |"
  fi
  ((j == jobs)) && break
  "$BIN/greedyrun" --progress 0 --pmi "$pmi" -n $((2 * hosts)) true </dev/null >/dev/null 2>"$WORK/job.err" ||
    fail "job $((j + 1)) failed: $(cat "$WORK/job.err")"
done
# First and last samples, process by process.
read -ra first <<<"${samples[1]}"
read -ra last <<<"${samples[-1]}"
for ((k = 0; k < ${#first[@]}; k += 2)); do
  who=$([[ $k == 0 ]] && echo session || echo "agent $((k / 2))")
  rss0=${first[k]} rss1=${last[k]} fd0=${first[k + 1]} fd1=${last[k + 1]}
  ((fd1 <= fd0 + 2)) || fail "$who: descriptors grew from $fd0 to $fd1 over $jobs jobs"
  ((rss1 <= rss0 * 5 / 4 || rss1 <= rss0 + 2048)) ||
    fail "$who: VmRSS grew from $rss0 kB to $rss1 kB over $jobs jobs"
done
pass "$jobs jobs (--pmi $pmi) on a session of $hosts hosts in $((($(ms) - t0) / 1000)) s: memory and descriptors flat"
