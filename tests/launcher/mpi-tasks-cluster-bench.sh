#!/usr/bin/env bash
# Ensembles of MPI tasks on the emulated cluster (H hosts of 2 slots, a per-hop delay, Slurm
# up), one sitting, runners interleaved per rep; each task is tests/mpi/wireup.c (PyPI MPICH
# 5.0.2: MPI_Init, an allreduce, a barrier) of R ranks:
#   greedy  one stream of N JSON task lines ({"ranks": R, "mpi": true}) on a session started
#           once over ssh (`--hosts n[1-H] --ppn 2`), each task a job of the session
#   srun    one `srun -N R/2 -n R --mpi=pmi2` per task inside `salloc -NH --ntasks-per-node
#           2` (Slurm places it), as many at once as the slots hold, M tasks
#   hydra   one `mpiexec.hydra -launcher ssh` per task (a pilot's MPI launch method), as many
#           at once as the slots hold, task i on the hosts after those of task i-1, M tasks
# Prints per runner: tasks, makespan, MPI tasks/s and greedy's ratio to it. All hosts share this
# machine's 2 cores: the MPI ranks' own start costs most of it, and the CPU decides.
# usage: tests/launcher/mpi-tasks-cluster-bench.sh [--hosts H] [--tasks N] [--other-tasks M]
#        [--ranks R] [--delay MS] [--reps K]
# Needs root. Leaves nothing behind.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# Hydra sends its own hostname to the remote daemons for call-backs, and this machine's name
# resolves to 127.0.0.1 (tests/launcher/session-bench.sh does the same).
if [[ ${GREEDY_BENCH_UTS:-} != 1 ]]; then
  exec env GREEDY_BENCH_UTS=1 unshare --uts bash -c 'hostname login && exec "$0" "$@"' "$0" "$@"
fi
hosts=16 ntasks=200 mother=100 ranks=4 delay=10 reps=1
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --tasks) ntasks=$2; shift 2 ;;
    --other-tasks) mother=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--tasks N] [--other-tasks M] [--ranks R] [--delay MS] [--reps K]" >&2; exit 2 ;;
  esac
done
need_root
. "$ROOT/tests/launcher/cluster-bench.sh"
. "$ROOT/tests/slurm/mpi-build.sh"
cluster_up --nodes "$hosts" --delay "$delay" --slurm
eval "$("$TC" env)"
wait_sshd "$hosts"
W=$GREEDY_TC_SCRATCH/mpi-tasks-bench
mkdir -p "$W"
cd "$W"
width=$((hosts * 2))
at_once=$((width / ranks))
((at_once >= 1)) || fail "$ranks ranks do not fit $width slots"
per=$(((ranks + 1) / 2)) # hosts per task, 2 slots each
python3 - "$ntasks" "$ranks" "$WIREUP" >greedy.tasks <<'EOF'
import json, sys
n, r, prog = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for _ in range(n):
    print(json.dumps({"argv": [prog], "ranks": r, "mpi": True, "env": {"EXPECT_SIZE": str(r)}}))
EOF
: >hydra.tasks
for ((i = 0; i < mother; i++)); do
  hl=""
  for ((j = 0; j < per; j++)); do hl+="${hl:+,}n$(((i * per + j) % hosts + 1)):2"; done
  echo "$hl" >>hydra.tasks
done
seq "$mother" >srun.tasks
session=""
trap '[[ -z $session ]] || GREEDY_SESSION=$session "$BIN/greedyrun" --end-session >/dev/null 2>&1; "$TC" down >/dev/null 2>&1 || true' EXIT
session=$("$BIN/greedyrun" --hosts "n[1-$hosts]" --ppn 2 --progress 0 --start-session | sed -n 's/^export GREEDY_SESSION=//p')
[[ -S $session ]] || fail "no session"

declare -A walls=() counts=([greedy]=$ntasks [srun]=$mother [hydra]=$mother)
for ((k = 0; k < reps; k++)); do
  for runner in greedy srun hydra; do
    settle
    t0=$(ms)
    case $runner in
      greedy)
        GREEDY_SESSION=$session "$BIN/greedyrun" --progress 0 --tasks greedy.tasks --results greedy.json >/dev/null ||
          fail "greedy: a task failed"
        [[ $(wc -l <greedy.json) == "$ntasks" ]] || fail "greedy: not every task reported"
        ;;
      srun)
        salloc -Q -N"$hosts" --ntasks-per-node 2 -- sh -c \
          "xargs -P $at_once -I{} env EXPECT_SIZE=$ranks srun -Q -N $per -n $ranks --mpi=pmi2 $WIREUP <srun.tasks >/dev/null" ||
          fail "srun per task"
        ;;
      hydra)
        xargs -P "$at_once" -I{} env EXPECT_SIZE="$ranks" "$MPICH5/bin/mpiexec.hydra" -launcher ssh \
          -hosts {} -n "$ranks" "$WIREUP" <hydra.tasks >/dev/null || fail "hydra per task"
        ;;
    esac
    ms=$(($(ms) - t0))
    walls[$runner]+="$ms "
    echo "mpi-tasks-cluster-bench: rep $k $runner ${counts[$runner]} tasks in $ms ms" >&2
  done
done
g=$(echo "${walls[greedy]}" | median)
grate=$(awk -v n="$ntasks" -v m="$g" 'BEGIN { print n / (m / 1000) }')
echo "| MPI tasks of $ranks ranks, $hosts hosts x 2 slots, ${delay} ms per hop | tasks | makespan s | MPI tasks/s | greedy's ratio |"
echo "|---|---|---|---|---|"
for runner in greedy srun hydra; do
  m=$(echo "${walls[$runner]}" | median)
  awk -v l="$runner" -v n="${counts[$runner]}" -v m="$m" -v g="$grate" \
    'BEGIN { r = n / (m / 1000); printf "| %s | %d | %.2f | %.1f | %.2fx |\n", l, n, m / 1000, r, g / r }'
done
