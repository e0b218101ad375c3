#!/bin/bash
# tests/slurm/het.sh [--release R]: heterogeneous steps under mpi/greedy on the emulated Slurm
# cluster of the machine's release (22.05), or with --release 24.11|26.05 on a cluster of that
# release (as tests/slurm/mpi.sh). Every case checks one MPI_COMM_WORLD over all components:
# each rank prints "rank R of N: ok" after checking the size (EXPECT_SIZE) and an allreduce
# across every rank, and ranks 0..N-1 appear exactly once each.
#   het        srun --mpi=greedy -w n3 -n2 P : -w n[1-2] -n3 P (a het job of two allocations;
#              component 0's node sorts last in the het node list): size 5, for each MPI of
#              the client matrix (machine: MPICH 5, Open MPI 4.1 and 5, Intel MPI; another
#              release: its own MPICH and Open MPI, then the PyPI MPICH 5, Open MPI 5 and
#              Intel MPI)
#   default    the same with no --mpi flag (MpiDefault=greedy)
#   salloc     salloc -n2 -w n4 : -n3 -w n[5-6], then one srun --het-group=0,1 over both
#   local      srun -N1 -n2 P : -N2 -n3 P inside a plain 3-node allocation (one job, two
#              components of one step)
#   three      three components (1 + 2 + 1 nodes): size 7
#   abort      MPI_Abort(3) in rank 3 (component 1): srun exits 3 fast naming component 1,
#              rank 3 and its node; nothing left on any host
#   shared     one node in both components: refused at once naming the node and the components
#              (reported as not run when Slurm's backfill keeps such a job queued, as it does
#              on this cluster)
# Env: CARGO_TARGET_DIR (default <repo>/target), HET_REPEAT (default 1: loops of the het case),
# HET_CLIENTS_ONLY (clients to run, space-separated; default all).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=6
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=het${RELEASE:+ $RELEASE}
need_shared_target
[[ -z $RELEASE_ROOT || $CARGO_TARGET_DIR == "$ROOT"/* || $CARGO_TARGET_DIR == /var/tmp/* ]] ||
  fail "--release needs CARGO_TARGET_DIR under the repo or /var/tmp"
need_root

. "$ROOT/tests/slurm/mpi-build.sh"
. "$ROOT/tests/mpi/clients.sh"

cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" --mpi-default greedy --scheduler backfill \
  ${RELEASE:+--release "$RELEASE"}
eval "$("$TC" env)"
SLOG=$(dirname "$SLURM_CONF")/../log
WORK=$GREEDY_TC_SCRATCH/het
mkdir -p "$WORK"
cd "$WORK"
# shellcheck disable=SC2034 # read by leftovers.sh
JOB_RE='slurmstepd|wireup'
. "$ROOT/tests/cluster/leftovers.sh"

# world NAME N: srun exited 0 and ranks 0..N-1 each said "rank R of N: ok" exactly once.
world() {
  local name=$1 n=$2 r
  ((RC == 0)) || fail "$name: exit $RC: $ERR $OUT"
  [[ $(grep -c "of $n: ok" <<<"$OUT") == "$n" ]] || fail "$name: expected $n ok lines: $OUT $ERR"
  for ((r = 0; r < n; r++)); do
    [[ $(grep -c "^rank $r of $n: ok" <<<"$OUT") == 1 ]] || fail "$name: rank $r not exactly once: $OUT"
  done
}

# The clients: the machine's matrix, or a release root's own MPICH and Open MPI and then the
# PyPI builds (self-contained under /var/tmp, which the roots see).
CLIENT_DIR=$WORK/clients
if [[ -n $RELEASE_ROOT ]]; then
  HET_CLIENTS=(root-mpich root-ompi mpich5 ompi5 impi)
  for c in mpich5 ompi5 impi; do client_build "$c" "$CLIENT_DIR"; done
else
  HET_CLIENTS=(mpich5 ompi4 ompi5 impi)
  for c in "${HET_CLIENTS[@]}"; do client_build "$c" "$CLIENT_DIR"; done
fi
[[ -z ${HET_CLIENTS_ONLY:-} ]] || read -ra HET_CLIENTS <<<"$HET_CLIENTS_ONLY"
het_cmd() { # NAME: CMD for client NAME
  case $1 in
    root-mpich) CMD=(env "$WIREUP") ;;
    root-ompi) CMD=(env "$OMPI") ;;
    *) client_cmd "$1" "$CLIENT_DIR" ;;
  esac
}
# sized N: P, the client's command expecting a world of N ranks (CMD is always `env ...`).
sized() { P=(env EXPECT_SIZE="$1" "${CMD[@]:1}"); }

for client in "${HET_CLIENTS[@]}"; do
  het_cmd "$client"
  sized 5
  for i in $(seq "${HET_REPEAT:-1}"); do
    run_timed "het-$client" 120 srun --mpi=greedy -w n3 -N1 -n2 "${P[@]}" : \
      -w 'n[1-2]' -N2 -n3 "${P[@]}"
    world "het-$client ($i)" 5
  done
  pass "$client: srun --mpi=greedy -w n3 -n2 : -w 'n[1-2]' -n3: one world of 5, ranks 0-4 once each, allreduce ok in ${SECS}s"
done

het_cmd "${HET_CLIENTS[0]}"
sized 5
run_timed het-default 120 srun -w n3 -N1 -n2 "${P[@]}" : -w 'n[1-2]' -N2 -n3 "${P[@]}"
world het-default 5
grep -q "mpi/greedy" "$SLOG"/slurmd-n3.log || fail "het-default: n3's slurmd log has no mpi/greedy line"
pass "${HET_CLIENTS[0]}: the same with no --mpi (MpiDefault=greedy): one world of 5 in ${SECS}s"

sized 7
run_timed het-three 120 srun --mpi=greedy -w n5 -N1 -n2 "${P[@]}" : \
  -w 'n[1-2]' -N2 -n4 "${P[@]}" : -w n4 -N1 -n1 "${P[@]}"
world het-three 7
pass "${HET_CLIENTS[0]}: three components (n5 : n[1-2] : n4): one world of 7 in ${SECS}s"

sized 5
# A het allocation, then one srun over both components (tasks per component from salloc).
run_timed het-salloc 120 salloc -w n4 -N1 -n2 : -w 'n[5-6]' -N2 -n3 \
  srun --het-group=0,1 --mpi=greedy "${P[@]}"
world het-salloc 5
pass "${HET_CLIENTS[0]}: salloc -n2 : -n3, srun --het-group=0,1: one world of 5 in ${SECS}s"

# Two components of one step inside a plain allocation.
run_timed het-local 120 salloc -N3 --exclusive -w 'n[1-3]' srun --mpi=greedy -N1 -n2 "${P[@]}" : \
  -N2 -n3 "${P[@]}"
world het-local 5
pass "${HET_CLIENTS[0]}: srun -N1 -n2 : -N2 -n3 in one 3-node allocation: one world of 5 in ${SECS}s"

for client in "${HET_CLIENTS[@]:0:2}"; do
  het_cmd "$client"
  prog=("${CMD[@]}")
  run_timed "het-abort-$client" 90 srun --mpi=greedy -w n3 -N1 -n2 "${prog[@]}" abort-after-init=3:3 : \
    -w 'n[1-2]' -N2 -n3 "${prog[@]}" abort-after-init=3:3
  ((RC == 3)) || fail "het-abort-$client: MPI_Abort(3) in rank 3 but srun exited $RC: $ERR"
  grep -Eq "mpi/greedy: job ended with exit code 3: component 1 on n[12]: .*rank 3" <<<"$ERR" ||
    fail "het-abort-$client: srun does not name component 1, rank 3 and its node: $ERR"
  (($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "het-abort-$client: took ${SECS}s: $ERR"
  no_leftovers "het-abort-$client"
  pass "$client: MPI_Abort(3) in rank 3 (component 1): srun exits 3 in ${SECS}s, nothing left: $(grep -o 'job ended with exit code 3: .*' <<<"$ERR" | head -1)"
done

# One node in both components: refused at once. slurmctld excludes a component's -w nodes from
# the others (proc_req.c _exclude_het_job_nodes), so only n5 and n6 are left to three nodes'
# worth of components, and one of n5, n6 holds ranks of both. Backfill may keep such a job
# queued ("able to allocate each component on a different node" first, heterogeneous_jobs
# docs): then the case is reported as not run.
run_timed het-shared 45 srun --mpi=greedy -x 'n[1-4]' -N2 -n2 "${CMD[@]}" : -x 'n[1-4]' -N1 -n1 "${CMD[@]}"
if grep -q "queued and waiting for resources" <<<"$ERR" && ((RC == 124 || RC == 143)); then
  echo "$TAG: not run: Slurm kept a het job with a shared node queued: $ERR"
else
  ((RC != 0)) || fail "het-shared: a node in two components was served: $OUT $ERR"
  grep -Eq "n[56] is in (components 0 and 1|2 components)" <<<"$ERR" ||
    fail "het-shared: no error naming the shared node and the components: $ERR"
  no_leftovers het-shared
  pass "a node in both components: refused in ${SECS}s ($(grep -Eo 'n[56] is in [^:]*' <<<"$ERR" | head -1))"
fi

echo "$TAG: all passed"
