#!/usr/bin/env bash
# A stream of N tasks that all read the same input of SIZE MB, on H loopback pseudo-hosts of S
# slots, one sitting, runners interleaved per rep:
#   staged  the input listed in each task's "inputs": greedyrun sends it down the launch tree
#           once (one copy per host) and each task reads $GREEDY_STAGED/in.bin on its host
#   fetched each task copies the input from the front end itself, through the remote shell
#           (`RSH host cat FILE`, as a task that scp's its input does), then reads its copy
# Both run through the same greedyrun stream; only the data's way differs. Prints makespan,
# tasks/s and the bytes that crossed from the front end (staged: SIZE x hosts, each over one
# tree edge; fetched: SIZE x tasks). On loopback a copy is a pipe on this machine's 2 cores:
# the CPU and memory bandwidth, not a network, decide the makespans.
# usage: tests/launcher/staging-bench.sh [--tasks N] [--hosts H] [--slots S] [--mb SIZE] [--reps K]
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ntasks=200 hosts=8 slots=2 mb=20 reps=1
while (($#)); do
  case $1 in
    --tasks) ntasks=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --mb) mb=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--tasks N] [--hosts H] [--slots S] [--mb SIZE] [--reps K]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench staging-bench
head -c "$((mb << 20))" /dev/urandom >"$work/in.bin"
list=$(loopback_hosts "$hosts" "$slots")
# Each task reads its whole input (cat to /dev/null) and checks its size, so a short copy
# fails the run.
want=$((mb << 20))
read_staged="cat \"\$GREEDY_STAGED/in.bin\" > /dev/null && test \$(wc -c < \"\$GREEDY_STAGED/in.bin\") = $want"
fetch="f=\$TMPDIR/in.\$GREEDY_TASK; $work/localsh host cat $work/in.bin > \$f && cat \$f > /dev/null && test \$(wc -c < \$f) = $want; rc=\$?; rm -f \$f; exit \$rc"
python3 - "$work" "$ntasks" "$read_staged" "$fetch" <<'EOF2'
import json, sys
work, n, staged, fetched = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(f"{work}/staged.tasks", "w") as f:
    f.writelines(json.dumps({"argv": ["sh", "-c", staged], "inputs": ["in.bin"]}) + "\n" for _ in range(n))
with open(f"{work}/fetched.tasks", "w") as f:
    f.writelines(json.dumps({"argv": ["sh", "-c", fetched]}) + "\n" for _ in range(n))
EOF2
mkdir -p "$work/tmp"
declare -A walls=()
for ((k = 0; k < reps; k++)); do
  for runner in staged fetched; do
    t0=$(ms)
    (cd "$work" && TMPDIR=$work/tmp "$BIN" --rsh "$work/localsh" -H "$list" --progress 0 \
      --tasks "$runner.tasks" --results "$runner.json" 2>"$runner.err" >/dev/null) ||
      fail "$runner: a task failed: $(tail -3 "$work/$runner.err")"
    t1=$(ms)
    [[ $(wc -l <"$work/$runner.json") == "$ntasks" ]] || fail "$runner: not every task reported"
    walls[$runner]+="$((t1 - t0)) "
    echo "staging-bench: rep $k $runner $((t1 - t0)) ms" >&2
  done
done
[[ -z $(ls -A "$work/tmp") ]] || fail "the hosts left staged files: $(ls "$work/tmp")"
s=$(echo "${walls[staged]}" | median)
echo "| $ntasks tasks reading one ${mb} MB input, $hosts hosts x $slots slots | makespan s | tasks/s | vs staged | MB from the front end |"
echo "|---|---|---|---|---|"
for runner in staged fetched; do
  m=$(echo "${walls[$runner]}" | median)
  moved=$([[ $runner == staged ]] && echo $((mb * hosts)) || echo $((mb * ntasks)))
  label=$([[ $runner == staged ]] && echo "inputs staged by greedy (once per host)" || echo "each task fetches its copy")
  awk -v n="$ntasks" -v m="$m" -v s="$s" -v l="$label" -v b="$moved" \
    'BEGIN { printf "| %s | %.2f | %.1f | %.2fx | %d |\n", l, m / 1000, n / (m / 1000), s / m, b }'
done
