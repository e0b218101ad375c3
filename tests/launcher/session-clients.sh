#!/usr/bin/env bash
# Many clients at once on one session: each is served, or refused with a message saying why;
# none hangs, none is lost, and the session goes on (docs/reliability.md).
#
# Starts a session on HOSTS loopback pseudo-hosts (2 slots each; a fake remote shell runs each
# agent here), then CLIENTS greedyrun clients at the same instant: odd ones a task stream of 10
# tasks with --results, even ones a job of 2 ranks. Each must end within 120 s, either served
# (exit 0 and exactly its output: every task's result once, each rank's line) or refused
# (non-zero, with a `greedyrun:` line saying why). Then one more job must run, and the
# session's descriptors must be back where they were. Prints one row of figures.
#
# usage: tests/launcher/session-clients.sh [--clients N] [--hosts H]   (defaults 100, 4)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
clients=100 hosts=4
while (($#)); do
  case $1 in
    --clients) clients=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    *) echo "usage: $0 [--clients N] [--hosts H]" >&2; exit 2 ;;
  esac
done
build -p greedy-launcher
WORK=$(mktemp -d /var/tmp/session-clients.XXXXXX)
at_exit 'rm -rf "$WORK"'
trap 'for c in "${AT_EXIT[@]}"; do eval "$c" || true; done' EXIT
. "$ROOT/tests/launcher/loopback.sh"
loopback_session "$WORK" "$hosts" 2 --pmi none
session=$SESSION_PID
fds() { find "/proc/$session/fd" -mindepth 1 -maxdepth 1 | wc -l; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$session/status"; }
fd0=$(fds) rss0=$(rss)

for ((c = 1; c <= clients; c++)); do
  for ((k = 1; k <= 10; k++)); do echo "echo c$c t$k"; done >"$WORK/tasks$c"
done
t0=$(ms)
pids=()
for ((c = 1; c <= clients; c++)); do
  if ((c % 2)); then
    timeout -k 5 120 "$BIN/greedyrun" --progress 0 --tasks "$WORK/tasks$c" --results "$WORK/r$c.json" \
      </dev/null >"$WORK/out$c" 2>"$WORK/err$c" &
  else
    timeout -k 5 120 "$BIN/greedyrun" --progress 0 --pmi none -n 2 sh -c "echo c$c rank \$GREEDY_RANK" \
      </dev/null >"$WORK/out$c" 2>"$WORK/err$c" &
  fi
  pids+=($!)
done
served=0 refused=0 reasons=""
for ((c = 1; c <= clients; c++)); do
  set +e
  wait "${pids[c - 1]}"
  rc=$?
  set -e
  ((rc != 124 && rc != 137)) || fail "client $c hung (killed after 120 s): $(tail -2 "$WORK/err$c")"
  if ((rc == 0)); then
    if ((c % 2)); then
      got=$(python3 -c 'import json,sys; print(sorted(json.loads(l)["task"] for l in open(sys.argv[1]) if l.strip()) == list(range(1, 11)))' "$WORK/r$c.json")
      [[ $got == True && $(sort -u "$WORK/out$c" | grep -c "^c$c t") == 10 ]] ||
        fail "client $c (stream) exited 0 without each task once: $(head -3 "$WORK/out$c")"
    else
      [[ $(sort "$WORK/out$c" | tr '\n' ' ') == "c$c rank 0 c$c rank 1 " ]] ||
        fail "client $c (job) exited 0 with output: $(head -3 "$WORK/out$c")"
    fi
    served=$((served + 1))
  else
    grep -q "^greedyrun: " "$WORK/err$c" || fail "client $c exited $rc without saying why: $(head -3 "$WORK/err$c")"
    refused=$((refused + 1))
    reasons+="$(grep -m1 "^greedyrun: " "$WORK/err$c" | cut -c1-120)"$'\n'
  fi
done
took=$((($(ms) - t0) / 1000))
"$BIN/greedyrun" --progress 0 --pmi none -n 2 true </dev/null || fail "the session served no job after the $clients clients"
for _ in $(seq 50); do (($(fds) <= fd0 + 2)) && break; sleep 0.1; done
fd1=$(fds) rss1=$(rss)
((fd1 <= fd0 + 2)) || fail "the session's descriptors grew from $fd0 to $fd1"
echo "| clients at once | served | refused | s | session fds before, after | session VmRSS kB before, after |"
echo "|---|---|---|---|---|---|"
echo "| $clients | $served | $refused | $took | $fd0, $fd1 | $rss0, $rss1 |"
[[ -z $reasons ]] || { echo "refusals:"; grep . <<<"$reasons" | sort | uniq -c | head -5; }
pass "$clients clients at once on a session of $hosts hosts: $served served, $refused refused with a reason, none hung, the session went on"
