#!/usr/bin/env bash
# Ensembles of MPI tasks: N MPICH tasks (tests/mpi/wireup.c: MPI_Init, an allreduce, a
# barrier) on H loopback pseudo-hosts of S slots, one sitting, runners interleaved per rep:
#   greedy  one stream of JSON task lines ({"ranks": R, "mpi": true}) on a running session:
#           each task a job of the session in the slots it took (docs/many-task.md)
#   hydra   one `mpiexec.hydra -launcher rsh` per task (PyPI MPICH 5.0.2, the fake remote shell
#           of tests/launcher/loopback.sh), as a pilot's MPI launch method does, xargs -P running
#           as many at once as the slots hold at the tasks' mean size, task i on host i mod H
#           (and the next hosts, for a task of more ranks than S)
#   rp      with --rp: RADICAL-Pilot (PyPI radical.pilot in $GREEDY_RP, default
#           /var/tmp/greedy-rp) with its own launcher: one local pilot of H x S cores (fake
#           nodes of S cores), its agent starting each task with its MPIEXEC launch method,
#           MPICH's mpiexec.hydra (tests/launcher/rp-tasks.py)
#   rp+greedy  the same pilot with greedyrun as its `mpiexec`, on a session of this machine
#           with twice the pilot's slots (RP frees a task's cores when its mpiexec returns, a
#           moment before the session has the job's slots back)
# Prints per runner: makespan, MPI tasks/s, the ratio to greedy, and slot utilisation (rank-
# seconds of the tasks' runs, launcher included, over slots x makespan); with --plot FILE the
# slots busy over time of the last rep, for gnuplot or a spreadsheet (seconds, greedy, hydra),
# and drawn in FILE.svg.
# Everything shares this machine's 2 cores: the CPU, not the tree, decides these figures.
# usage: tests/launcher/mpi-tasks-bench.sh [--tasks N] [--hosts H] [--slots S]
#        [--ranks R|mixed] [--reps K] [--plot FILE] [--program PATH] [--rp]
#        (mixed: ranks 1, 2, 4, 8, 16 in turn; --program: each task runs PATH instead of the
#        MPI hello, e.g. /bin/true for the launchers' own cost)
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ntasks=200 hosts=8 slots=4 ranks=4 reps=1 plot="" program="" runners=(greedy hydra)
while (($#)); do
  case $1 in
    --tasks) ntasks=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --rp) runners+=(rp rp+greedy); shift ;;
    *) echo "usage: $0 [--tasks N] [--hosts H] [--slots S] [--ranks R|mixed] [--reps K] [--plot FILE] [--rp]" >&2; exit 2 ;;
  esac
done
MPICH5=${GREEDY_MPICH5:-/var/tmp/greedy-mpich5}
[[ -x $MPICH5/bin/mpicc ]] || fail "no MPICH 5 in $MPICH5 (tests/mpi/clients.sh installs it)"
. "$ROOT/tests/launcher/loopback.sh"
loopback_bench mpi-tasks-bench
if [[ -n $program ]]; then
  ln -s "$program" "$work/hello"
else
  "$MPICH5/bin/mpicc" -O1 -o "$work/hello" "$ROOT/tests/mpi/wireup.c"
fi
width=$((hosts * slots))
mapfile -t names < <(loopback_hosts "$hosts" | tr , '\n')
ranks_of() { # ranks of task $1
  if [[ $ranks == mixed ]]; then
    local sizes=(1 2 4 8 16)
    echo "${sizes[$(($1 % 5))]}"
  else
    echo "$ranks"
  fi
}
: >"$work/greedy.tasks"
: >"$work/hydra.tasks"
for ((i = 0; i < ntasks; i++)); do
  r=$(ranks_of "$i")
  printf '{"argv":["%s/hello"],"ranks":%d,"mpi":true,"env":{"EXPECT_SIZE":"%d"}}\n' "$work" "$r" "$r" >>"$work/greedy.tasks"
  # Its hosts: as many as its ranks need at S each, from host i mod H on.
  k=$(((r + slots - 1) / slots)) hl=""
  for ((j = 0; j < k; j++)); do hl+="${hl:+,}${names[$(((i + j) % hosts))]}:$slots"; done
  echo "$r $hl" >>"$work/hydra.tasks"
done
# One Hydra task, timed from inside: its ranks, start and end (ns) appended to $work/hydra.runs.
cat >"$work/hydra-task" <<EOF
#!/bin/sh
t0=\$(date +%s%N)
EXPECT_SIZE=\$1 "$MPICH5/bin/mpiexec.hydra" -launcher rsh -launcher-exec "$work/localsh" -hosts "\$2" -n "\$1" "$work/hello" >/dev/null || exit 1
echo "\$1 \$t0 \$(date +%s%N)" >>"$work/hydra.runs"
EOF
chmod +x "$work/hydra-task"
session=$("$BIN" --rsh "$work/localsh" -H "$(loopback_hosts "$hosts" "$slots")" --progress 0 --start-session | sed -n 's/^export GREEDY_SESSION=//p')
[[ -n $session ]] || fail "the session did not start"
if [[ " ${runners[*]} " == *" rp "* ]]; then
  RP=${GREEDY_RP:-/var/tmp/greedy-rp}
  [[ -x $RP/bin/radical-pilot-agent_0 ]] ||
    fail "no RADICAL-Pilot in $RP (python3 -m venv $RP && $RP/bin/pip install radical.pilot==1.103.2)"
  # The pilot's resource: this machine as fake nodes of S cores, MPI tasks by the mpiexec
  # first on $RP_BENCH_MPI (RADICAL_CONFIG_USER_DIR is where RP reads user configs).
  mkdir -p "$work/rp/.radical/pilot/configs" "$work/rp/bin"
  cat >"$work/rp/.radical/pilot/configs/resource_bench.json" <<JSON
{"localhost": {
  "description": "mpi-tasks-bench", "default_schema": "local",
  "schemas": {"local": {"job_manager_endpoint": "fork://localhost", "filesystem_endpoint": "file://localhost"}},
  "resource_manager": "FORK", "agent_config": "default", "agent_scheduler": "CONTINUOUS",
  "agent_spawner": "POPEN", "rp_version": "installed", "virtenv_mode": "local", "python_dist": "default",
  "launch_methods": {"order": ["FORK", "MPIEXEC"], "FORK": {},
                     "MPIEXEC": {"pre_exec_cached": ["export PATH=\$RP_BENCH_MPI:\$PATH"]}},
  "cores_per_node": $slots, "gpus_per_node": 0, "lfs_path_per_node": "/tmp", "lfs_size_per_node": 1024,
  "mem_per_node": 4096, "fake_resources": true}}
JSON
  ln -s "$BIN" "$work/rp/bin/mpiexec"
  rp_session=$("$BIN" --rsh "$work/localsh" -H "localhost:$((2 * width))" --progress 0 --start-session | sed -n 's/^export GREEDY_SESSION=//p')
  [[ -n $rp_session ]] || fail "the session for rp+greedy did not start"
  trap 'GREEDY_SESSION=$rp_session "$BIN" --end-session >/dev/null 2>&1 || true; loopback_cleanup' EXIT
fi

# Runs $1 once; prints its makespan in ms and leaves its runs (ranks, start s, end s; from the
# runner's start) in $work/$1.spans.
run() {
  local t0 t1
  t0=$(date +%s%N)
  case $1 in
    greedy)
      GREEDY_SESSION=$session "$BIN" --progress 0 --tasks "$work/greedy.tasks" --results "$work/r.json" >/dev/null ||
        fail "greedy: a task failed"
      t1=$(date +%s%N)
      [[ $(wc -l <"$work/r.json") == "$ntasks" ]] || fail "greedy: not every task reported"
      python3 -c '
import json, sys
for l in open(sys.argv[1]):
    v = json.loads(l)
    r = len(v.get("rank_hosts", [0]))
    print(r, v["end_s"] - v["wall_s"], v["end_s"])' "$work/r.json" >"$work/greedy.spans"
      ;;
    hydra)
      : >"$work/hydra.runs"
      # Concurrency: as many tasks as the slots hold at the tasks' mean size.
      local p
      p=$(awk -v w="$width" '{ s += $1 } END { p = int(w / (s / NR)); print (p < 1 ? 1 : p) }' "$work/hydra.tasks")
      xargs -P "$p" -L 1 "$work/hydra-task" <"$work/hydra.tasks" || fail "hydra: a task failed"
      t1=$(date +%s%N)
      [[ $(wc -l <"$work/hydra.runs") == "$ntasks" ]] || fail "hydra: not every task reported"
      awk -v t0="$t0" '{ print $1, ($2 - t0) / 1e9, ($3 - t0) / 1e9 }' "$work/hydra.runs" >"$work/hydra.spans"
      ;;
    rp | rp+greedy)
      # RP's own clock: from the tasks' submission, the pilot active.
      local mpi=$MPICH5/bin env=()
      [[ $1 == rp+greedy ]] && mpi=$work/rp/bin env=(GREEDY_SESSION="$rp_session")
      rm -rf "$work/rp/sandbox"
      (
        # shellcheck disable=SC1091
        . "$RP/bin/activate"
        cd "$work/rp" # RP's client writes its session's directory here
        env "${env[@]}" RP_BENCH_MPI="$mpi" RADICAL_CONFIG_USER_DIR="$work/rp" \
          timeout -s KILL 1800 python3 "$ROOT/tests/launcher/rp-tasks.py" "$work/hydra.tasks" \
          "$work/hello" "$width" "$work/rp/sandbox" "$work/$1.spans" 2>"$work/$1.err"
      ) || fail "$1: $(tail -3 "$work/$1.err")"
      return
      ;;
  esac
  echo $(((t1 - t0) / 1000000))
}

# Slot utilisation of $1's runs over a makespan of $2 ms.
utilisation() {
  awk -v w="$width" -v ms="$2" '{ busy += $1 * ($3 - $2) } END { printf "%.0f %%", 100 * busy / (w * ms / 1000) }' "$work/$1.spans"
}

declare -A walls=() busy=()
for ((k = 0; k < reps; k++)); do
  for runner in "${runners[@]}"; do
    ms=$(run "$runner")
    walls[$runner]+="$ms "
    busy[$runner]=$(utilisation "$runner" "$ms")
    echo "mpi-tasks-bench: rep $k $runner ${ms} ms, slots busy ${busy[$runner]}" >&2
  done
done
g=$(echo "${walls[greedy]}" | median)
echo "| $ntasks tasks of $ranks ranks of ${program:-the MPI hello}, $hosts hosts x $slots slots | makespan s | MPI tasks/s | vs greedy | slots busy (last rep) |"
echo "|---|---|---|---|---|"
declare -A labels=([greedy]="greedyrun --tasks on a session" [hydra]="mpiexec.hydra per task (xargs -P)"
  [rp]="RADICAL-Pilot 1.103, its agent and mpiexec.hydra" [rp+greedy]="RADICAL-Pilot 1.103 with greedyrun as mpiexec")
for runner in "${runners[@]}"; do
  m=$(echo "${walls[$runner]}" | median)
  label=${labels[$runner]}
  awk -v n="$ntasks" -v m="$m" -v g="$g" -v l="$label" -v u="${busy[$runner]}" \
    'BEGIN { printf "| %s | %.2f | %.1f | %.2fx | %s |\n", l, m / 1000, n / (m / 1000), g / m, u }'
done
if [[ -n $plot ]]; then
  # Slots busy at each 0.1 s of the last rep, per runner.
  python3 - "$work" "$plot" "$width" "${runners[@]}" <<'EOF'
import sys
work, out, slots, runners = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
series = {}
for runner in runners:
    spans = [tuple(map(float, l.split())) for l in open(f"{work}/{runner}.spans")]
    end = max(e for _, _, e in spans)
    steps = int(end / 0.1) + 1
    series[runner] = [sum(r for r, s, e in spans if s <= t * 0.1 < e) for t in range(steps)]
n = max(len(v) for v in series.values())
with open(out, "w") as f:
    f.write(f"# seconds {' '.join(runners)} (slots busy)\n")
    for t in range(n):
        row = [series[r][t] if t < len(series[r]) else 0 for r in runners]
        f.write(f"{t * 0.1:.1f} " + " ".join(f"{v:.0f}" for v in row) + "\n")
# The same as an SVG: slots busy (0 to all) over seconds, one line per runner.
W, H, M = 640, 220, 40
sx = (W - 2 * M) / max(n * 0.1, 1e-9)
sy = (H - 2 * M) / max(slots, max(max(v) for v in series.values()))
colours = {"greedy": "#1f77b4", "hydra": "#ff7f0e", "rp": "#2ca02c", "rp+greedy": "#9467bd"}
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{M}" y1="{H - M}" x2="{W - M}" y2="{H - M}" stroke="black"/>',
       f'<line x1="{M}" y1="{M}" x2="{M}" y2="{H - M}" stroke="black"/>',
       f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">seconds</text>',
       f'<text x="4" y="{M - 10}">slots busy (of {slots})</text>',
       f'<line x1="{M}" y1="{H - M - slots * sy:.1f}" x2="{W - M}" y2="{H - M - slots * sy:.1f}" stroke="#bbb" stroke-dasharray="4"/>']
for sec in range(0, int(n * 0.1) + 1, max(1, int(n * 0.1) // 8)):
    svg.append(f'<text x="{M + sec * sx:.1f}" y="{H - M + 14}" text-anchor="middle">{sec}</text>')
for i, (runner, v) in enumerate(series.items()):
    pts = " ".join(f"{M + t * 0.1 * sx:.1f},{H - M - y * sy:.1f}" for t, y in enumerate(v))
    svg.append(f'<polyline fill="none" stroke="{colours[runner]}" stroke-width="1.5" points="{pts}"/>')
    svg.append(f'<text x="{W - M - 120}" y="{M + 14 * i}" fill="{colours[runner]}">{runner}</text>')
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg) + "\n")
EOF
fi
