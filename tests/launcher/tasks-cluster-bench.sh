#!/usr/bin/env bash
# Task streams (issue 20) on the emulated cluster (H hosts of 2 slots, a per-hop delay, Slurm
# up), one sitting, side by side, for N tasks of /bin/true:
#   ceiling     `xargs -P 2H -n 1 /bin/true` on the login: this machine's own fork/exec loop,
#               /bin/true exec'd directly per line (given the line, which it ignores), as
#               greedy's agents run a plain line
#   ceiling-sh  `xargs -P 2H sh -c`: the same through a shell per task (what Parsl's bash apps,
#               GNU parallel and srun-in-a-script pay, and greedy's agents did before)
#   gr-fresh    greedyrun --hosts n[1-H] --ppn 2 --tasks FILE (agents started over ssh)
#   gr-session  the same on a running session's agents (started once, before the runs)
#   parsl       Parsl's HighThroughputExecutor (PyPI), N bash apps; its worker pools started by
#               greedy-parsl's GreedyLauncher, timed once every pool is connected
#   srun        one `srun -N1 -n1 --overlap` per task inside `salloc -NH --ntasks-per-node 2`,
#               2H at a time (xargs -P), for M tasks (Slurm steps are slow: M < N)
#   parallel    GNU parallel over ssh, `-S 2/n1,…` (2 jobs per host) with `-M` (one ssh
#               ControlMaster per host, as its manual advises for many short jobs), M tasks
# Prints one markdown row per runner: median wall of R runs, tasks/s, of the ceiling, and the
# ratios the issue asks (≥ 10x srun, ≥ 3x Parsl). All hosts share this machine's 2 cores: these
# are CPU figures. Also writes tasks/s over time (one point per second, from --results' end
# times) of a fresh and a session stream: rate.csv beside the CSV.
# usage: tests/launcher/tasks-cluster-bench.sh [--hosts H] [--tasks N] [--srun-tasks M]
#        [--delay MS] [--reps R]
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
hosts=16 ntasks=10000 msrun=500 delay=10 reps=3
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --tasks) ntasks=$2; shift 2 ;;
    --srun-tasks) msrun=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--tasks N] [--srun-tasks M] [--delay MS] [--reps R]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/cluster-bench.sh"
VENV=${GREEDY_PARSL_VENV:-/var/tmp/greedy-parsl}
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import parsl' 2>/dev/null || "$VENV/bin/pip" install -q parsl || fail "pip install parsl"

cluster_up --nodes "$hosts" --delay "$delay" --slurm
eval "$("$TC" env)"
wait_sshd "$hosts"
W=$GREEDY_TC_SCRATCH/tasks-bench
mkdir -p "$W"
cd "$W"
width=$((hosts * 2))
list="n[1-$hosts]"
awk -v n="$ntasks" 'BEGIN { for (i = 0; i < n; i++) print "/bin/true" }' >tasks
awk -v n="$msrun" 'BEGIN { for (i = 0; i < n; i++) print "/bin/true" }' >srun-tasks
logins=$(seq -f "2/n%g" -s , 1 "$hosts")
command -v parallel >/dev/null || fail "GNU parallel is not installed (scripts/install-deps)"
CSV=$W/results.csv
echo "runner,run,tasks,wall_ms" >"$CSV"
session=""
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$BIN/greedyrun" --end-session >/dev/null 2>&1 || true
}
trap 'cleanup; "$TC" down >/dev/null 2>&1 || true' EXIT
session=$("$BIN/greedyrun" --hosts "$list" --ppn 2 --progress 0 --start-session | sed -n 's/^export GREEDY_SESSION=//p')
[[ -S $session ]] || fail "no session"

# rate LABEL FILE: how many tasks of a --results file ended in each second of the stream
# (its end_s), as CSV rows LABEL,SECOND,TASKS.
rate() {
  "$VENV/bin/python" -c '
import collections, json, sys
ends = collections.Counter(int(json.loads(l)["end_s"]) for l in open(sys.argv[2]))
for s in range(max(ends) + 1):
    print("{},{},{}".format(sys.argv[1], s, ends[s]))
' "$1" "$2"
}
# svg CSV OUT: tasks/s over time, one line per label of `rate`'s rows.
svg() {
  awk -F, -v title="tasks/s over time: $ntasks x /bin/true on $hosts hosts x 2, ${delay} ms per hop" '
    { x[NR] = $2; y[NR] = $3; l[NR] = $1; if ($2 > mx) mx = $2; if ($3 > my) my = $3
      if (!($1 in seen)) { seen[$1] = 1; labels[++k] = $1 } }
    END {
      W = 640; H = 320; L = 60; B = 40; T = 30; R = 130; q = "\""
      sx = (W - L - R) / (mx > 0 ? mx : 1); sy = (H - T - B) / (my > 0 ? my : 1)
      split("#1f77b4 #d62728 #2ca02c", col, " ")
      printf "<svg xmlns=%shttp://www.w3.org/2000/svg%s width=%s%d%s height=%s%d%s font-family=%ssans-serif%s font-size=%s12%s>\n", q, q, q, W, q, q, H, q, q, q, q, q
      printf "<rect width=%s100%%%s height=%s100%%%s fill=%swhite%s/>\n", q, q, q, q, q, q
      printf "<text x=%s%d%s y=%s18%s>%s</text>\n", q, L, q, q, q, title
      printf "<line x1=%s%d%s y1=%s%d%s x2=%s%d%s y2=%s%d%s stroke=%sblack%s/>\n", q, L, q, q, H - B, q, q, W - R, q, q, H - B, q, q, q
      printf "<line x1=%s%d%s y1=%s%d%s x2=%s%d%s y2=%s%d%s stroke=%sblack%s/>\n", q, L, q, q, T, q, q, L, q, q, H - B, q, q, q
      printf "<text x=%s%d%s y=%s%d%s>seconds into the stream (0 to %d)</text>\n", q, L + 100, q, q, H - 10, q, mx
      printf "<text x=%s5%s y=%s%d%s>%d/s</text><text x=%s5%s y=%s%d%s>0</text>\n", q, q, q, T + 5, q, my, q, q, q, H - B, q
      for (c = 1; c <= k; c++) {
        pts = ""
        for (i = 1; i <= NR; i++) if (l[i] == labels[c]) pts = pts sprintf("%.1f,%.1f ", L + x[i] * sx, H - B - y[i] * sy)
        printf "<polyline fill=%snone%s stroke=%s%s%s stroke-width=%s1.5%s points=%s%s%s/>\n", q, q, q, col[c], q, q, q, q, pts, q
        printf "<text x=%s%d%s y=%s%d%s fill=%s%s%s>%s</text>\n", q, W - R + 8, q, q, T + 16 * c, q, q, col[c], q, labels[c]
      }
      print "</svg>"
    }' "$1" >"$2"
}

for run in $(seq "$reps"); do
  t0=$(ms)
  xargs -d '\n' -P "$width" -n 1 /bin/true <tasks
  echo "ceiling,$run,$ntasks,$(($(ms) - t0))" >>"$CSV"
  t0=$(ms)
  xargs -d '\n' -P "$width" -n 1 sh -c <tasks
  echo "ceiling-sh,$run,$ntasks,$(($(ms) - t0))" >>"$CSV"
  t0=$(ms)
  env -u GREEDY_SESSION "$BIN/greedyrun" --hosts "$list" --ppn 2 --progress 0 --tasks tasks --results "fresh$run.json" ||
    fail "gr-fresh"
  echo "gr-fresh,$run,$ntasks,$(($(ms) - t0))" >>"$CSV"
  [[ $(wc -l <"fresh$run.json") == "$ntasks" ]] || fail "gr-fresh: not every task reported"
  t0=$(ms)
  GREEDY_SESSION=$session "$BIN/greedyrun" --tasks tasks --results "session$run.json" || fail "gr-session"
  echo "gr-session,$run,$ntasks,$(($(ms) - t0))" >>"$CSV"
  [[ $(wc -l <"session$run.json") == "$ntasks" ]] || fail "gr-session: not every task reported"
  out=$(env -u GREEDY_SESSION GREEDYRUN="$BIN/greedyrun" HOSTS="$list" NODES="$hosts" WORKERS=2 \
    ADDRESS="${GREEDY_TC_NET:-10.123.1}.1" N="$ntasks" COMMAND=/bin/true PARSL_RUN_DIR="$W/parsl$run" \
    PATH="$VENV/bin:$PATH" PYTHONPATH="$ROOT/python/greedy-parsl" \
    timeout 900 "$VENV/bin/python" "$ROOT/tests/parsl/bench_htex.py") || fail "parsl: see $W/parsl$run"
  secs=$(sed -n 's/^parsl-bench: [0-9]* tasks in \([0-9.]*\) s$/\1/p' <<<"$out")
  [[ -n $secs ]] || fail "parsl: $out"
  echo "parsl,$run,$ntasks,$(awk -v s="$secs" 'BEGIN { printf "%d", s * 1000 }')" >>"$CSV"
  t0=$(ms)
  salloc -Q -N"$hosts" --ntasks-per-node 2 -- sh -c "xargs -d '\n' -P $width -n 1 srun -Q -N1 -n1 --overlap --mpi=none <srun-tasks" ||
    fail "srun per task"
  echo "srun,$run,$msrun,$(($(ms) - t0))" >>"$CSV"
  t0=$(ms)
  parallel --will-cite -M -S "$logins" <srun-tasks || fail "GNU parallel"
  echo "parallel,$run,$msrun,$(($(ms) - t0))" >>"$CSV"
done
out=${BENCH_OUT:-$CARGO_TARGET_DIR}
cp "$CSV" "$out/tasks-cluster-bench.csv"
{ rate gr-fresh fresh1.json; rate gr-session session1.json; } >"$W/rate.csv"
cp "$W/rate.csv" "$out/tasks-rate.csv"
svg "$W/rate.csv" "$out/tasks-rate.svg"

echo "| runner | tasks | median s | tasks/s | of the ceiling |"
echo "|---|---|---|---|---|"
awk -F, 'NR > 1 { walls[$1] = walls[$1] " " $4; n[$1] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " ")
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= k; i++) { r = order[i]; rate[r] = n[r] / (median(walls[r]) / 1000) }
    for (i = 1; i <= k; i++) {
      r = order[i]
      printf "| %s | %d | %.2f | %.0f | %.0f %% |\n", r, n[r], median(walls[r]) / 1000, rate[r], 100 * rate[r] / rate["ceiling"]
    }
    printf "\ngr-session vs srun: %.1fx; vs parsl: %.1fx; vs GNU parallel: %.1fx\n", rate["gr-session"] / rate["srun"], rate["gr-session"] / rate["parsl"], rate["gr-session"] / rate["parallel"]
  }' "$CSV"
