#!/usr/bin/env bash
# mpi4py.futures.MPIPoolExecutor under greedyrun: one rank maps a function over 1,000 items on
# workers the pool spawns with MPI_Comm_spawn (tests/mpi4py/pool.py), on a loopback pseudo-host
# (tests/launcher/loopback.sh) of 4 slots, with Open MPI 5 (PMIx) and MPICH 5 (PMI-1), as a fresh
# job and as a job on a session. The pool sizes itself as mpi4py does by default,
# MPI_UNIVERSE_SIZE - 1 workers: 3, the free slots. Checks every result and that the workers
# were spawned processes, not the parent.
# usage: tests/mpi4py/pool.sh [ITEMS] (default 1000)
set -euo pipefail

TAG=mpi4py-pool
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$ROOT/tests/mpi/clients.sh"
. "$ROOT/tests/launcher/loopback.sh"

items=${1:-1000}
cd "$ROOT"
build -p greedy-launcher
G=$BIN/greedyrun
impi_venv
work=$(mktemp -d /var/tmp/greedy-mpi4py-pool.XXXXXX)
session=""
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$G" --end-session >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
loopback_rsh "$work"
# Slots for the parent and three workers (a fresh job's spawns run on the hosts of its ranks).
hosts=$(loopback_hosts 1 4)


# pool WHERE LIB: one pool job, fresh or on the session; fails naming what went wrong.
pool() {
  local where=$1 lib=$2 out rc=0 t0
  local -a env launcher
  read -ra env <<<"$(libmpi_env "$lib")"
  if [[ $where == fresh ]]; then
    launcher=("$G" --rsh "$work/localsh" -H "$hosts" --progress 0 -n 1)
  else
    launcher=(env "GREEDY_SESSION=$session" "$G" --progress 0 -n 1)
  fi
  t0=$(ms)
  out=$(timeout 120 env "${env[@]}" "${launcher[@]}" "$IMPI/bin/python" "$ROOT/tests/mpi4py/pool.py" "$items" 2>&1) || rc=$?
  ((rc == 0)) || fail "$where $lib: exit $rc: $out"
  grep -q "^pool: $items of $items results right from 3 workers" <<<"$out" || fail "$where $lib: $out"
  echo "$TAG: $where $lib: $items items on 3 spawned workers in $(($(ms) - t0)) ms"
}

for lib in ompi5 mpich5; do pool fresh "$lib"; done
eval "$("$G" --rsh "$work/localsh" -H "$hosts" --progress 0 --start-session)"
session=${GREEDY_SESSION:?the session did not start}
unset GREEDY_SESSION
for lib in ompi5 mpich5; do pool session "$lib"; done
pass "MPIPoolExecutor mapped $items items on spawned workers, Open MPI 5 and MPICH 5, fresh and on a session"
