#!/bin/bash
# tests/slurm/spawn.sh [--release R]: MPI_Comm_spawn under srun --mpi=greedy on the emulated
# Slurm cluster of the machine's release (22.05), or with --release 24.11|26.05 on a cluster of
# that release (as tests/slurm/mpi.sh). The children run as a nested step of the job, started
# by the user's srun (plugin/mpi/src/nested.rs). tests/mpi/spawn.c: two parents spawn two
# copies of the program, check each other over the intercommunicator and exit 3 on success.
# MPICH is PyPI's 5.0.2 on every release (the 24.11 root's own MPICH 4.2.1, ch4:ucx, fails
# MPI_Open_port on these hosts before it asks the launcher anything); Open MPI the release's.
#   spawn      MPICH, srun -N2 -n2: the parents spawn 2 children, which get their parents'
#              token and send back their ranks ("children ok"); srun exits 3 (the parents')
#   impi       the same with Intel MPI (impi-rt 2021, its PMI-1 client)
#   multiple   MPICH, MPI_Comm_spawn_multiple (tests/mpi/spawn_multiple.c across n2 n3) in a
#              3-node allocation: 2 copies of the first program on n2 and 1 of the second on n3
#              (info "host"), one nested step, each child told its program's appnum
#   die        MPICH, the children exit 7 before MPI_Init (they never connect back): srun
#              exits 7 within 30 s naming the spawned job, nothing left on any host
#   nofit      MPICH, one parent in a job of one CPU spawns 9 children (tests/mpi/spawn_latency.c):
#              Slurm refuses the nested step, the parent gets an MPI error at once and ends
#              (exit 1), srun relays Slurm's reason
#   pool       mpi4py's MPIPoolExecutor (tests/mpi4py/pool.py) maps a function over 1,000 items
#              on the workers it spawns, UNIVERSE_SIZE - 1 = 3: srun -n1 in an allocation of 4
#              CPUs (the universe is the job's CPUs). The machine's release only (the venv's
#              Python is the machine's)
#   ompi       Open MPI (PMIx), srun -N2 -n2: as spawn; the children's step hands its tasks
#              to the parent step's stepds, which serve the child namespace beside the
#              parents' (plugin/mpi/src/attach.rs)
#   pool-ompi  mpi4py's MPIPoolExecutor as pool, on PyPI's Open MPI 5 (PMIx spawn)
#   ompi-die   Open MPI, the children exit 7 before MPI_Init: srun exits 7 within 30 s naming
#              the spawned job and its host, nothing left on any host
# Env: CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=3
RELEASE="" RELEASE_ROOT=""
[[ ${1:-} != --release ]] || release_select "${2:-}"
TAG=spawn${RELEASE:+ $RELEASE}
need_shared_target
[[ -z $RELEASE_ROOT || $CARGO_TARGET_DIR == "$ROOT"/* || $CARGO_TARGET_DIR == /var/tmp/* ]] ||
  fail "--release needs CARGO_TARGET_DIR under the repo or /var/tmp"
need_root

. "$ROOT/tests/slurm/mpi-build.sh"
build_mpi_prog "$ROOT/tests/mpi/spawn.c" spawn
. "$ROOT/tests/mpi/clients.sh"
SPAWN=$BINDIR/spawn-mpich5
"$MPICH5/bin/mpicc" -O1 -o "$SPAWN" "$ROOT/tests/mpi/spawn.c" || fail "PyPI MPICH's mpicc"
"$MPICH5/bin/mpicc" -O1 -o "$BINDIR/spawn-latency-mpich5" "$ROOT/tests/mpi/spawn_latency.c" ||
  fail "PyPI MPICH's mpicc"
"$MPICH5/bin/mpicc" -O1 -o "$BINDIR/spawn-multiple-mpich5" "$ROOT/tests/mpi/spawn_multiple.c" ||
  fail "PyPI MPICH's mpicc"
impi_venv
gcc -O1 -I"$IMPI/include" -o "$BINDIR/spawn-impi" "$ROOT/tests/mpi/spawn.c" \
  -L"$IMPI/lib" -lmpi -Wl,-rpath,"$IMPI/lib" || fail "gcc with Intel MPI"

cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" --mpi-default greedy \
  ${RELEASE:+--release "$RELEASE"}
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/spawn
mkdir -p "$WORK"
cd "$WORK"
# shellcheck disable=SC2034 # read by leftovers.sh
JOB_RE='slurmstepd|/spawn'
. "$ROOT/tests/cluster/leftovers.sh"


spawned() { # NAME: both parents spawned, both children checked, exit 3
  ((RC == 3)) || fail "$1: srun exited $RC, not the parents' 3: $OUT $ERR"
  grep -q "^rank 0 of 2: children ok$" <<<"$OUT" || fail "$1: rank 0 did not hear from its children: $OUT $ERR"
  [[ $(grep -c "^child [01] of 2: parent ok$" <<<"$OUT") == 2 ]] ||
    fail "$1: expected 2 children told their parents' token: $OUT $ERR"
  [[ $(grep -c "^rank [01] of 2: spawned 2$" <<<"$OUT") == 2 ]] || fail "$1: expected 2 parents spawning: $OUT $ERR"
  no_leftovers "$1"
}
run_timed spawn 120 srun -N2 -n2 --mpi=greedy "$SPAWN"
spawned spawn
pass "MPICH: srun -N2 -n2 --mpi=greedy: 2 parents spawn 2 children as a nested step, both ways checked, in ${SECS}s"

# In srun's environment: the children get srun's (a parent's own `env` is not theirs).
run_timed impi 120 env FI_PROVIDER=tcp I_MPI_FABRICS=shm:ofi srun -N2 -n2 --mpi=greedy "$BINDIR/spawn-impi"
spawned impi
pass "Intel MPI: the same, in ${SECS}s"

run_timed multiple 120 salloc -Q -N3 -n9 srun -N2 -n2 --mpi=greedy "$BINDIR/spawn-multiple-mpich5" across n2 n3
((RC == 0)) || fail "multiple: exit $RC: $OUT $ERR"
for seen in "child 0 app 0 on n2" "child 1 app 0 on n2" "child 2 app 1 on n3"; do
  grep -q "^parent: $seen$" <<<"$OUT" || fail "multiple: no \"parent: $seen\": $OUT $ERR"
done
no_leftovers multiple
pass "MPICH: MPI_Comm_spawn_multiple, 2 + 1 children each on its program's host, one nested step, in ${SECS}s"

run_timed die 60 srun -N2 -n2 --mpi=greedy "$SPAWN" --children-die
((RC == 7)) || fail "die: the children exited 7 but srun exited $RC: $OUT $ERR"
grep -q "spawned job .*@1 .*failed" <<<"$ERR" || fail "die: srun does not name the spawned job: $ERR"
(($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "die: took ${SECS}s: $ERR"
no_leftovers die
pass "MPICH: children exiting 7 before MPI_Init: srun exits 7 in ${SECS}s naming the spawned job, nothing left"

run_timed nofit 60 srun -N1 -n1 --mpi=greedy "$BINDIR/spawn-latency-mpich5" 9 1
((RC == 1)) || fail "nofit: srun exited $RC, not the parent's 1: $OUT $ERR"
grep -q "^spawn 9 round 1 failed" <<<"$OUT" || fail "nofit: the parent got no spawn error: $OUT $ERR"
grep -q "More processors requested than permitted" <<<"$ERR" || fail "nofit: srun does not say why: $ERR"
(($(awk -v s="$SECS" 'BEGIN { print (s < 20) }'))) || fail "nofit: took ${SECS}s: $ERR"
no_leftovers nofit
pass "MPICH: 9 children in a job of one CPU: the parent gets an MPI error in ${SECS}s, srun relays Slurm's reason"

if [[ -z $RELEASE ]]; then
  # In srun's environment: the workers get srun's, as under Hydra and Slurm's pmi2.
  run_timed pool 120 env MPI4PY_LIBMPI="$MPICH5/lib/libmpi.so.12" salloc -Q -N2 -n4 srun -n1 --mpi=greedy \
    "$IMPI/bin/python" "$ROOT/tests/mpi4py/pool.py" 1000
  ((RC == 0)) || fail "pool: exit $RC: $OUT $ERR"
  grep -q "^pool: 1000 of 1000 results right from 3 workers" <<<"$OUT" || fail "pool: $OUT $ERR"
  no_leftovers pool
  pass "MPICH: MPIPoolExecutor mapped 1,000 items on 3 spawned workers (the job's 4 CPUs less the parent) in ${SECS}s"
fi

if [[ -z $RELEASE ]]; then
  ompi5_venv
  read -ra ompi5_env <<<"$(libmpi_env ompi5)"
  mapfile -t ompi5_env < <(printf '%s\n' "${ompi5_env[@]}" | grep -v '_if_include=')
  run_timed pool-ompi 120 env "${ompi5_env[@]}" salloc -Q -N2 -n4 srun -n1 --mpi=greedy \
    "$IMPI/bin/python" "$ROOT/tests/mpi4py/pool.py" 1000
  ((RC == 0)) || fail "pool-ompi: exit $RC: $OUT $ERR"
  grep -q "^pool: 1000 of 1000 results right from 3 workers" <<<"$OUT" || fail "pool-ompi: $OUT $ERR"
  no_leftovers pool-ompi
  pass "Open MPI 5: MPIPoolExecutor mapped 1,000 items on 3 spawned workers in ${SECS}s"
fi

run_timed ompi 120 srun -N2 -n2 --mpi=greedy "$BINDIR/spawn-ompi"
spawned ompi
pass "Open MPI: 2 parents spawn 2 children served by the parent step's PMIx servers, both ways checked, in ${SECS}s"

run_timed ompi-die 60 srun -N2 -n2 --mpi=greedy "$BINDIR/spawn-ompi" --children-die
((RC == 7)) || fail "ompi-die: the children exited 7 but srun exited $RC: $OUT $ERR"
# Either child may be the first to end: the report names whichever it was, with its host.
grep -Eq "spawned job .*@1 rank [01] on n[12] exited with code 7" <<<"$ERR" || fail "ompi-die: srun does not name the spawned rank: $ERR"
(($(awk -v s="$SECS" 'BEGIN { print (s < 30) }'))) || fail "ompi-die: took ${SECS}s: $ERR"
no_leftovers ompi-die
pass "Open MPI: children exiting 7 before MPI_Init: srun exits 7 in ${SECS}s naming the spawned rank and host, nothing left"
