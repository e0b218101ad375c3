#!/bin/bash
# tests/slurm/soak.sh: many consecutive mpi/greedy steps on the emulated 4-host Slurm cluster,
# to show that none fails spuriously and that slurmd does not leak (not part of scripts/test:
# about 15 min with the defaults).
#
#   1. N steps of `srun --mpi=greedy -N4 -n8 /bin/true` (tasks that end before the overlay join
#      does: issue 15), counting failures;
#   2. M MPI steps of tests/mpi/wireup.c, 4 hosts x 2 ranks, alternating Open MPI (PMIx) and
#      MPICH (PyPI mpich 5, PMI-1), each checked for 8 correct ranks;
#   3. before and after: each host's slurmd descriptor count and RSS (/proc/PID/fd, VmRSS), and
#      the descriptors of each host's slurmstepd during a probe step (`sleep`), which must stay
#      flat; nothing of ours may be left running.
# Prints a summary; exits 1 if any step failed or anything grew.
#
# usage: tests/slurm/soak.sh [N [M]]     (defaults 1000 and 200; run as root)
# Env: CARGO_TARGET_DIR (default <repo>/target), GREEDY_MPICH5 (default /var/tmp/greedy-mpich5),
# SOAK_RSS_SLACK_KB (default 1024: slurmd's RSS may grow this much, allocator noise).
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=4
TRUE_STEPS=${1:-1000}
MPI_STEPS=${2:-200}
RSS_SLACK=${SOAK_RSS_SLACK_KB:-1024}
need_shared_target
need_root

# --- build (as tests/slurm/mpi.sh) -------------------------------------------------------------
. "$ROOT/tests/slurm/mpi-build.sh"
MPICONF=$BINDIR/soak-mpi.conf
printf '%s\n' '# mpi/greedy soak settings' 'GreedyFenceTimeout=120' >"$MPICONF"

# --- cluster -----------------------------------------------------------------------------------
cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR" --mpi-conf "$MPICONF"
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/soak
mkdir -p "$WORK"
cd "$WORK"
JOB_RE='slurmstepd|wireup|/bin/true|sleep 4343'
. "$ROOT/tests/cluster/leftovers.sh"

# pid_of HOST COMM: the process named COMM in that host's namespaces (the first one).
pid_of() {
  local pid
  for pid in $(ip netns pids "gtc-$1" 2>/dev/null); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] && { echo "$pid"; return 0; }
  done
  return 1
}
fds() { local n; n=$(ls "/proc/$1/fd" 2>/dev/null | wc -l) && echo "$n"; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# sample TAG: slurmd fds and RSS on every host, then slurmstepd fds during a probe step.
declare -A SAMPLE
sample() {
  local tag=$1 h pid probe _i
  for h in $GREEDY_TC_HOSTS; do
    pid=$(pid_of "$h" slurmd) || fail "$tag: no slurmd on $h"
    SAMPLE[$tag,$h,slurmd]=$pid
    SAMPLE[$tag,$h,fds]=$(fds "$pid")
    SAMPLE[$tag,$h,rss]=$(rss_kb "$pid")
  done
  srun --mpi=greedy -N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2 --job-name=soak-probe \
    sleep 4343 >/dev/null 2>&1 &
  probe=$!
  for h in $GREEDY_TC_HOSTS; do
    for _i in $(seq 100); do
      # (sleep's own stepd: the probe's tasks are running once `sleep 4343` exists.)
      [[ $(leftovers) == *"gtc-$h:"*"sleep 4343"* ]] && break
      sleep 0.1
    done
    pid=$(pid_of "$h" slurmstepd) || fail "$tag: no slurmstepd on $h during the probe step"
    SAMPLE[$tag,$h,stepd]=$(fds "$pid")
  done
  scancel --quiet --name=soak-probe || true
  kill "$probe" 2>/dev/null || true
  wait "$probe" 2>/dev/null || true
  no_leftovers "probe step ($tag)"
}

# steps NAME COUNT CMD...: runs CMD COUNT times; sets FAILS, SECS; keeps the first failures' output.
steps() {
  local name=$1 count=$2 i t0 rc
  shift 2
  FAILS=0
  t0=$(ms)
  for i in $(seq "$count"); do
    set +e
    "$@" "$i" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
    rc=$?
    set -e
    if ((rc != 0)); then
      FAILS=$((FAILS + 1))
      echo "soak: $name $i of $count failed (exit $rc): $(tr '\n' ' ' <"$WORK/$name.err" | cut -c1-400)" >&2
      ((FAILS <= 5)) && cp "$WORK/$name.err" "$WORK/$name-failed-$i.err"
    fi
  done
  SECS=$(awk -v a="$t0" -v b="$(ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
}
true_step() { timeout -k 5 60 srun --mpi=greedy -N"$NODES" -n$((2 * NODES)) /bin/true; }
mpi_step() { # alternating: odd steps Open MPI, even steps MPICH; 8 correct ranks or a failure
  local prog=$OMPI out
  (($1 % 2)) || prog=$WIREUP
  out=$(timeout -k 5 90 srun --mpi=greedy -N"$NODES" -n$((2 * NODES)) --ntasks-per-node=2 \
    env EXPECT_SIZE=$((2 * NODES)) "$prog") || return
  [[ $(grep -c " of $((2 * NODES)): ok" <<<"$out") == $((2 * NODES)) ]] || { echo "$out" >&2; return 1; }
}

sample before
steps true "$TRUE_STEPS" true_step
TRUE_FAILS=$FAILS TRUE_SECS=$SECS
steps mpi "$MPI_STEPS" mpi_step
MPI_FAILS=$FAILS MPI_SECS=$SECS
no_leftovers "after the soak"
sample after

# --- summary -----------------------------------------------------------------------------------
bad=0
echo "soak: $TRUE_STEPS x srun --mpi=greedy -N$NODES -n$((2 * NODES)) /bin/true: $TRUE_FAILS failed (${TRUE_SECS} s)"
echo "soak: $MPI_STEPS x wireup $NODES x 2 (Open MPI and MPICH alternating): $MPI_FAILS failed (${MPI_SECS} s)"
((TRUE_FAILS == 0 && MPI_FAILS == 0)) || bad=1
printf 'soak: %-4s %-22s %-22s %-18s\n' host "slurmd fds" "slurmd RSS (KiB)" "slurmstepd fds"
for h in $GREEDY_TC_HOSTS; do
  printf 'soak: %-4s %-22s %-22s %-18s\n' "$h" \
    "${SAMPLE[before,$h,fds]} -> ${SAMPLE[after,$h,fds]}" \
    "${SAMPLE[before,$h,rss]} -> ${SAMPLE[after,$h,rss]}" \
    "${SAMPLE[before,$h,stepd]} -> ${SAMPLE[after,$h,stepd]}"
  [[ ${SAMPLE[before,$h,slurmd]} == "${SAMPLE[after,$h,slurmd]}" ]] || { echo "soak: slurmd on $h restarted" >&2; bad=1; }
  ((SAMPLE[after,$h,fds] <= SAMPLE[before,$h,fds])) || { echo "soak: slurmd on $h holds more descriptors" >&2; bad=1; }
  ((SAMPLE[after,$h,stepd] <= SAMPLE[before,$h,stepd])) || { echo "soak: slurmstepd on $h holds more descriptors" >&2; bad=1; }
  ((SAMPLE[after,$h,rss] <= SAMPLE[before,$h,rss] + RSS_SLACK)) || { echo "soak: slurmd on $h grew by more than $RSS_SLACK KiB" >&2; bad=1; }
done
((bad == 0)) || fail "see above"
echo "soak: all passed"
