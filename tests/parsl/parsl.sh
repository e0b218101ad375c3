#!/usr/bin/env bash
# Parsl (PyPI) runs its HighThroughputExecutor's worker pools through greedy-parsl's
# GreedyLauncher (python/greedy-parsl): tests/parsl/test_launcher.py on two loopback
# pseudo-hosts, each agent started by a fake remote shell on this machine; and its MPI apps
# (MPIExecutor) as jobs of a session, greedyrun being their `mpiexec`: tests/parsl/test_mpi_apps.py. Installs parsl into
# a venv under /var/tmp on first use (PARSL_VERSION pins it).
# usage: tests/parsl/parsl.sh
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
VENV=${GREEDY_PARSL_VENV:-/var/tmp/greedy-parsl}
. "$ROOT/tests/launcher/loopback.sh"
cd "$ROOT"
build --release -p greedy-launcher
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import parsl' 2>/dev/null ||
  "$VENV/bin/pip" install -q "parsl${PARSL_VERSION:+==$PARSL_VERSION}" || fail "pip install parsl"
work=$(mktemp -d /var/tmp/greedy-parsl-test.XXXXXX)
GREEDYRUN=$BIN/greedyrun
cleanup() {
  [[ -z ${GREEDY_SESSION:-} ]] || "$GREEDYRUN" --end-session >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
loopback_rsh "$work"
# The worker pools are Parsl's own process_worker_pool.py, from the venv.
export PATH=$VENV/bin:$PATH
cd "$work"
parsl_run() { # RUN_DIR
  GREEDYRUN=$GREEDYRUN GREEDY_RSH=$work/localsh HOSTS=127.1.0.1,127.1.0.2 \
    PYTHONPATH=$ROOT/python/greedy-parsl PARSL_RUN_DIR=$work/$1 \
    timeout 300 "$VENV/bin/python" "$ROOT/tests/parsl/test_launcher.py" ||
    fail "parsl ($1): see its runinfo"
  sleep 1
  local left
  # The session itself stays (its command line names the fake shell too).
  left=$(pgrep -f "process_worker_pool|$work/localsh" | grep -vxF "$(pgrep -f -- "--start-session" || echo none)" || true)
  [[ -z $left ]] || fail "left behind after parsl ($1): $(ps -o args= -p "$(echo $left | tr ' ' ,)")"
}
unset GREEDY_SESSION
parsl_run fresh
# On a running session: the pools run on its agents, no remote shell is started for them.
eval "$("$GREEDYRUN" --rsh "$work/localsh" -H 127.1.0.1:1,127.1.0.2:1 --progress 0 --start-session)"
[[ -n ${GREEDY_SESSION:-} ]] || fail "the session did not start"
export GREEDY_SESSION
parsl_run session
"$GREEDYRUN" --status 2>&1 | grep -q "2 hosts (2 up, 0 lost)" || fail "the session lost a host"
"$GREEDYRUN" --end-session || fail "--end-session"
unset GREEDY_SESSION

# Parsl's MPI apps (MPIExecutor, its `mpiexec -n -ppn -hosts` prefix) as jobs of a session:
# greedyrun is `mpiexec`, the batch job's nodes (PBS_NODEFILE) are the session's hosts.
MPICH5=${GREEDY_MPICH5:-/var/tmp/greedy-mpich5}
"$MPICH5/bin/mpicc" -O1 -o "$work/hello" "$ROOT/tests/mpi/wireup.c" || fail "mpicc (tests/mpi/clients.sh installs MPICH)"
mkdir -p "$work/bin"
ln -s "$GREEDYRUN" "$work/bin/mpiexec"
printf '127.1.0.1\n127.1.0.2\n' >"$work/nodes"
eval "$("$GREEDYRUN" --rsh "$work/localsh" -H 127.1.0.1:2,127.1.0.2:2 --progress 0 --start-session)"
[[ -n ${GREEDY_SESSION:-} ]] || fail "the session did not start"
export GREEDY_SESSION
PATH=$work/bin:$PATH PBS_NODEFILE=$work/nodes HELLO=$work/hello PARSL_RUN_DIR=$work/mpi \
  timeout 300 "$VENV/bin/python" "$ROOT/tests/parsl/test_mpi_apps.py" || fail "parsl's MPI apps: see $work/mpi"
"$GREEDYRUN" --end-session || fail "--end-session"
unset GREEDY_SESSION
echo "parsl: all passed"
