#!/usr/bin/env bash
# mpi4py's own test suite (4.1.2, PyPI's sdist) under greedyrun, compared test by test with the
# same suite under the baseline launcher of the same MPI library: every test that passes under
# the baseline must pass under greedy unless tests/mpi4py/exceptions.txt lists it with its
# reason, and every listed exception that passes now fails the run too (the list stays true).
# Runs on this machine only: greedyrun's agents are started by a fake remote shell on N
# loopback pseudo-hosts (tests/launcher/loopback.sh), one rank each.
#
# Configurations (the MPI library mpi4py loads is chosen by MPI4PY_LIBMPI, as in clients.sh):
#   greedy-ompi5   greedyrun, mpi4py on PyPI's Open MPI 5.0 (PMIx); baseline prte-ompi5:
#                  prterun from the same wheel (PRRTE)
#   greedy-ompi4   greedyrun, mpi4py on Debian's Open MPI 4.1 (PMIx); baseline mpirun-ompi4:
#                  Debian's mpirun (ORTE: under PRRTE's prterun, Open MPI 4.1's ranks come up
#                  as singletons)
#   greedy-mpich5  greedyrun, mpi4py on PyPI's MPICH 5 (PMI-1); baseline hydra-mpich5: MPICH's
#                  mpiexec with the same N pseudo-hosts (-launcher fork), so that its ranks talk
#                  over the network module as greedy's do (PRRTE serves no PMI-1)
#   session-ompi5  a job on a greedyrun session (--start-session), mpi4py on Open MPI 5;
#                  baseline prte-ompi5
#   srun-ompi5     srun --mpi=greedy on the emulated Slurm cluster (N hosts, one task each,
#                  mpi_greedy.so built and installed as tests/slurm/mpi.sh does), mpi4py on Open
#                  MPI 5; baseline pmix-ompi5: srun --mpi=pmix, Slurm's own plugin, on the same
#                  cluster: whatever a site's users run under pmix must run under MpiDefault=greedy
#   srun-mpich5    srun --mpi=greedy on the emulated cluster, mpi4py on PyPI's MPICH 5 (PMI-1:
#                  spawn as a nested step of the job); baseline hydra-mpich5 (Slurm's own pmi2
#                  would need free CPUs beside the parents for every spawn)
#
# Test selection: by default the modules that touch what a launcher provides: spawn and dynproc
# (PMIx_Spawn, publish/lookup, connect), the world and its communicators (comm, comm_inter,
# comm_topo, group), point to point and collectives across ranks (p2p_obj, p2p_buf, cco_obj,
# cco_buf), environment, info and errors (environ, info, errhandler, exceptions), sessions and
# process sets (session), fault tolerance (ulfm), threads and the utilities on top (threads,
# util_pool, util_pkl5). --all runs every module (a few minutes more per configuration).
#
# Each test has a timeout (--timeout, default 20 s, 60 s with --all): runner.py's watchdog ends a rank stuck in
# one test, the job ends, and the test is reported "died" by name; the suite then runs again
# without the tests already done, so one hang costs one timeout. A test that dies is run once
# more in the next round: compare.py reports one that passes then as a flake, by name, and
# judges its second result. Tests listed in
# exceptions.txt with a reason starting "hangs:" or "ends-job:" are not run (each would cost a
# timeout or a round); --hangs runs them too, to check that they still do.
#
# The configurations run one after the other, so their per-test times (the kept logs) saw
# different loads on the shared cores: compare timings with tests/mpi4py/session-vs-fresh.sh.
#
# usage: tests/mpi4py/suite.sh [--all] [--hangs] [--np N] [--timeout S] [--keep] [CONFIG…]
#   N ranks per job (default 2); CONFIG… a subset of the greedy configurations (their
#   baselines run too). --keep leaves the logs (per configuration, round and rank) in the work
#   dir.
set -euo pipefail

TAG=mpi4py-suite
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$ROOT/tests/mpi/clients.sh"
. "$ROOT/tests/launcher/loopback.sh"
. "$ROOT/tests/mpi4py/install.sh"

all=0 hangs=0 np=2 per_test="" keep=0 configs=()
while (($#)); do
  case $1 in
    --all) all=1 ;;
    --hangs) hangs=1 ;;
    --np) np=${2:?--np needs N} && shift ;;
    --timeout) per_test=${2:?--timeout needs seconds} && shift ;;
    --keep) keep=1 ;;
    greedy-ompi5 | greedy-ompi4 | greedy-mpich5 | session-ompi5 | srun-ompi5 | srun-mpich5) configs+=("$1") ;;
    *) echo "usage: $0 [--all] [--hangs] [--np N] [--timeout S] [--keep] [greedy-ompi5|greedy-ompi4|greedy-mpich5|session-ompi5|srun-ompi5|srun-mpich5]…" >&2; exit 2 ;;
  esac
  shift
done
((${#configs[@]})) || configs=(greedy-ompi5 greedy-ompi4 greedy-mpich5 session-ompi5 srun-ompi5 srun-mpich5)
# test_rma's slowest tests take over 10 s on a loaded machine (one-sided over TCP).
((all)) && per_test=${per_test:-60}
per_test=${per_test:-20}
select=()
((all)) || select=(-i '^test_(spawn|dynproc|comm|comm_inter|comm_topo|group|p2p_obj|p2p_buf|cco_obj|cco_buf|environ|info|errhandler|exceptions|session|ulfm|threads|util_pool|util_pkl5)\.py$')
XFILE=$ROOT/tests/mpi4py/exceptions.txt

cd "$ROOT"
build -p greedy-launcher
GREEDYRUN=$BIN/greedyrun
mpi4py_tests
impi_venv
ompi5_venv
work=$(mktemp -d /var/tmp/greedy-mpi4py-suite.XXXXXX)
session="" cluster=0
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$GREEDYRUN" --end-session >/dev/null 2>&1 || true
  ((!cluster)) || (cd "$ROOT" && "$TC" down >/dev/null 2>&1) || true
  if ((keep)); then echo "$TAG: logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
loopback_rsh "$work"
hosts=$(loopback_hosts "$np" 1)

baseline_of() {
  [[ $1 != srun-ompi5 ]] || { echo pmix-ompi5; return; }
  case ${1#*-} in
    ompi5) echo prte-ompi5 ;;
    ompi4) echo mpirun-ompi4 ;;
    mpich5) echo hydra-mpich5 ;;
  esac
}


# The launcher of a configuration, ending with its rank count.
launcher_of() {
  case $1 in
    prte-*) echo "env PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1 $OMPI5/bin/prterun --map-by :oversubscribe -n $np" ;;
    mpirun-*) echo "mpirun.openmpi --allow-run-as-root --oversubscribe -n $np" ;;
    hydra-*) echo "$MPICH5/bin/mpiexec -launcher fork -hosts ${hosts//:1/} -n $np" ;;
    greedy-*) echo "$GREEDYRUN --rsh $work/localsh -H $hosts --progress 0 --oversubscribe -n $np" ;;
    session-*) echo "env GREEDY_SESSION=$session $GREEDYRUN --progress 0 --oversubscribe -n $np" ;;
    pmix-*) echo "srun --mpi=pmix --exclusive -N $np -n $np" ;;
    srun-*) echo "srun --mpi=greedy --exclusive -N $np -n $np" ;;
  esac
}

# launch CONFIG ROUND: one job of the suite, without the tests in $work/CONFIG.done.
launch() {
  local config=$1 round=$2
  local -a env launcher
  read -ra env <<<"$(libmpi_env "${config#*-}")"
  # Between emulated hosts TCP runs over their own interfaces, not the loopback.
  # Each emulated host has its own /tmp, where mpi4py's spawn tests write the script their
  # children run (on whichever node Slurm places them): a directory every host sees instead.
  if [[ $config == srun-* || $config == pmix-* ]]; then
    mapfile -t env < <(printf '%s\n' "${env[@]}" | grep -v '_if_include=')
    mkdir -p "$work/tmp"
    env+=("TMPDIR=$work/tmp")
  fi
  read -ra launcher <<<"$(launcher_of "$config")"
  # A whole round's backstop, should a rank hang outside any test (MPI_Init, MPI_Finalize).
  timeout -k 10 "${GREEDY_MPI4PY_ROUND_TIMEOUT:-600}" env "${env[@]}" "${launcher[@]}" \
    "$IMPI/bin/python" "$ROOT/tests/mpi4py/runner.py" "$M4T" "$work/$config.r$round.log" "$per_test" \
    "${select[@]}" --xfile "$work/$config.done" >"$work/$config.r$round.out" 2>&1
}

# unfinished LOG…: the tests some rank started and never finished, in the suite's order (by
# how many tests the rank had started before it).
unfinished() {
  awk 'FNR == 1 { n = 0 } $1 == "start" { s[FILENAME, $2] = ++n } $1 != "start" { delete s[FILENAME, $2] }
    END { for (k in s) { split(k, t, SUBSEP); print s[k], t[2] } }' "$@" | sort -n | awk '!seen[$2]++ { print $2 }'
}

# run_config CONFIG: the suite in rounds until one completes (every rank logged "done"), or
# one runs no test. A round ends early when a test hangs (runner.py's watchdog) or when the
# job is ended under a finished test (a rank's launcher aborted it): the next round runs the
# rest.
run_config() {
  local config=$1 round t0 rc died first rerun logs
  t0=$(ms)
  # Listed hangs and job killers are not run (unless --hangs): "*ID" is main.py's exact-suffix
  # pattern.
  ((hangs)) || awk -v c="$config" '!/^#/ && NF >= 3 && $3 ~ /^(hangs|ends-job):/ {
      p = $2; gsub(/\*/, ".*", p); if (c ~ ("^" p "$")) print "*" $1 }' "$XFILE" >"$work/$config.skip"
  touch "$work/$config.skip"
  cp "$work/$config.skip" "$work/$config.done"
  for round in $(seq 40); do
    rc=0
    launch "$config" "$round" || rc=$?
    logs=("$work/$config.r$round".log.*)
    [[ -e ${logs[0]} ]] || break
    died=$(unfinished "${logs[@]}")
    first=${died%%$'\n'*}
    # Done: every test a rank finished, and of those left unfinished the first in the suite's
    # order (the ranks that went on to later tests were waiting for the one stuck in it; their
    # tests run again) unless this is its first death, which earns it one more round.
    rerun=0
    if [[ -n $first ]] && ! grep -qxF -- "$first" "$work/$config.retried" 2>/dev/null; then
      rerun=1
      echo "$first" >>"$work/$config.retried"
    fi
    { cat "$work/$config.skip"; awk '$1 != "start" && NF > 1 { print "*" $2 }' "$work/$config".r*.log.*
      [[ -z $first ]] || echo "*$first"; } | sort -u | { ((rerun)) && grep -vxF -- "*$first" || cat; } \
      >"$work/$config.done"
    [[ $(cat "${logs[@]}" | grep -cx 'done') -lt $np ]] || break
    grep -q '^start' "${logs[@]}" || break
    echo "$TAG: $config round $round: exit $rc${first:+ in $first}; running the rest again$( ((rerun)) && echo ", $first too")"
    # Why the round ended, for a CI log that keeps nothing else: the launcher's own lines and a
    # rank's watchdog stack.
    grep -E '^(greedyrun|prterun|mpirun|\[mpiexec|Fatal Python error|Timeout)' "$work/$config.r$round.out" |
      tail -8 | sed "s/^/$TAG:   /" || true
  done
  [[ -e $work/$config.r1.log.0 ]] || fail "$config: no rank ran the suite; its output ends:
$(tail -20 "$work/$config.r1.out")"
  echo "$TAG: $config: $(((($(ms) - t0) + 500) / 1000)) s in $round round(s)"
}

# slurm_cluster: the emulated Slurm cluster of N hosts with mpi_greedy.so, once (shared with
# other engineers' tests: wait for a free one, take down only ours).
slurm_cluster() {
  ((!cluster)) || return 0
  need_root
  . "$ROOT/tests/slurm/mpi-build.sh"
  GREEDY_TC_QUIET=1 cluster_claim --nodes "$np" --slurm --plugindir "$PLUGDIR"
  cluster=1
  eval "$("$TC" env)"
}

t0=$(ms)
pairs=()
for config in "${configs[@]}"; do
  base=$(baseline_of "$config")
  [[ $config != srun-* ]] || slurm_cluster
  [[ -e $work/$base.done ]] || run_config "$base"
  if [[ $config == session-* ]]; then
    eval "$("$GREEDYRUN" --rsh "$work/localsh" -H "$hosts" --progress 0 --start-session)"
    session=${GREEDY_SESSION:?the session did not start}
    unset GREEDY_SESSION
  fi
  run_config "$config"
  if [[ $config == session-* ]]; then
    GREEDY_SESSION=$session "$GREEDYRUN" --end-session >/dev/null || fail "--end-session"
    session=""
  fi
  pairs+=("$config=$base")
done
python3 "$ROOT/tests/mpi4py/compare.py" "$work" "$XFILE" "${pairs[@]}" ||
  fail "a test that passes under its baseline fails under greedy, or a listed exception passes (above)"
pass "mpi4py $M4VERSION's suite, $np ranks: every test passing under the baselines passes under greedy but the listed exceptions ($(((($(ms) - t0) + 500) / 1000)) s)"
