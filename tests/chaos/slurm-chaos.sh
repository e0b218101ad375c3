#!/usr/bin/env bash
# Faults under `srun --mpi=greedy` and under Slurm's own `--mpi=pmix`, side by side, on the
# emulated Slurm cluster: the same Open MPI program (tests/mpi/wireup.c, 2 ranks a host, past
# MPI_Init and sleeping), the same fault on the same host, one plugin after the other:
#   slurmd-restart  the host's slurmd is SIGKILLed and started again under the running step
#                   (its slurmstepd and ranks go on): the step must end well
#   node-killed     every process of the host's namespace (slurmd, slurmstepd, the ranks) is
#                   stopped and killed, as a crash: the step must end, naming the host
# For each: seconds from the fault until srun says a word naming the host (or "never"), until
# no rank runs on the hosts left, until srun ended (srun is killed LIMIT s after the fault),
# srun's exit code, the ranks that ended well, and the step's processes left on any host 20 s
# after srun (must be 0 for greedy). Prints one table; fails if under mpi/greedy anything is
# left, the restart case does not end well, or srun does not end after a node died.
#
# usage: tests/chaos/slurm-chaos.sh [--nodes N] [--sleep SECS] [--limit SECS]
#   defaults 8 hosts, ranks sleeping 20 s, srun killed 120 s after the fault
set -euo pipefail

TAG=slurm-chaos
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
NODES=8 nap=20 limit=120
while (($#)); do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --sleep) nap=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    *) echo "usage: $0 [--nodes N] [--sleep SECS] [--limit SECS]" >&2; exit 2 ;;
  esac
done
need_root
need_shared_target
. "$ROOT/tests/slurm/mpi-build.sh"
cluster_up --nodes "$NODES" --slurm --plugindir "$PLUGDIR"
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/slurm-chaos
mkdir -p "$WORK"
cd "$WORK"
JOB_RE='slurmstepd|wireup-ompi'
. "$ROOT/tests/cluster/leftovers.sh"
RANKS=$((2 * NODES))

# step NAME MPI: the step in the background, stderr lines stamped (PID, ERR, OUT).
step() {
  ERR=$WORK/$1.err OUT=$WORK/$1.out
  srun -N"$NODES" -n"$RANKS" --ntasks-per-node=2 --mpi="$2" --job-name="chaos-$1" \
    env OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp "$OMPI" "sleep-after-init=$nap" \
    </dev/null >"$OUT" 2> >(while IFS= read -r l; do echo "$(ms) $l"; done >"$ERR") &
  PID=$!
}
# Waits until every rank is past MPI_Init (up to 60 s).
initialised() {
  for _ in $(seq 600); do
    (($(grep -c initialised "$OUT" || true) >= RANKS)) && return 0
    sleep 0.1
  done
  fail "$1: not every rank past MPI_Init after 60 s: $(tail -3 "$ERR")"
}
# Seconds from $1 (ms) until the first stamped line of ERR naming host $2, or "never".
told_after() {
  awk -v t0="$1" -v h="$2" '$0 ~ ("(^|[^a-z0-9])" h "([^0-9]|$)") { printf "%.1f", ($1 - t0) / 1000; found = 1; exit }
    END { if (!found) print "never" }' "$ERR"
}
# How many step processes are left 20 s after the step ended (none for a clean end).
left_after() {
  local left n=0
  for _ in $(seq 100); do
    left=$(leftovers)
    [[ -z $left ]] && break
    sleep 0.2
  done
  [[ -n $left ]] && n=$(tr ';' '\n' <<<"$left" | grep -c gtc-) && echo "$1: left $left" >&2
  echo "$n"
}
ROWS=()
# Seconds since $1 (ms).
since() { awk -v t="$(($(ms) - $1))" 'BEGIN { printf "%.1f", t / 1000 }'; }
# Whether a rank of the step runs on a host other than $1.
ranks_elsewhere() {
  local p
  for p in $(pgrep -f "^$OMPI " || true); do
    [[ $(ip netns identify "$p" 2>/dev/null) != "gtc-$1" ]] && return 0
  done
  return 1
}
# case FAULT MPI HOST: runs the step, injects FAULT on HOST once every rank is running.
run_case() {
  local fault=$1 mpi=$2 host=$3 t0 rc ended told gone=never
  step "$fault-$mpi" "$mpi"
  initialised "$fault-$mpi"
  t0=$(ms)
  case $fault in
    slurmd-restart) "$TC" restart-slurmd "$host" ;;
    node-killed) kill_host "$host" ;;
  esac
  while kill -0 "$PID" 2>/dev/null && (($(ms) - t0 < limit * 1000)); do
    if [[ $gone == never ]] && ! ranks_elsewhere "$host"; then gone=$(since "$t0"); fi
    sleep 0.2
  done
  ended=$(since "$t0")
  if kill -0 "$PID" 2>/dev/null; then
    ended="never (killed at $limit)"
    pkill -KILL -f "^srun .*--job-name=chaos-$fault-$mpi " || true
  fi
  set +e
  wait "$PID"
  rc=$?
  set -e
  [[ $gone == never ]] && ! ranks_elsewhere "$host" && gone=$(since "$t0")
  told=$(told_after "$t0" "$host")
  local ok_ranks
  ok_ranks=$(grep -c "of $RANKS: ok" "$OUT" || true)
  local left
  left=$(left_after "$fault-$mpi")
  ROWS+=("| $fault | $mpi | $host | $told | $gone | $ended | $rc | $ok_ranks of $RANKS | $left |")
  echo "slurm-chaos: $fault under --mpi=$mpi on $host: told after $told s, ranks gone after $gone s, srun ended after $ended s, exit $rc, $ok_ranks ranks ok, left $left" >&2
  LAST_RC=$rc LAST_LEFT=$left LAST_OK=$ok_ranks LAST_END=$ended
}

# slurmd restarted under the step: both must end well.
host=n$((2 + RANDOM % (NODES - 1)))
for mpi in greedy pmix; do
  run_case slurmd-restart "$mpi" "$host"
  [[ $mpi == pmix ]] || ((LAST_RC == 0 && LAST_OK == RANKS && LAST_LEFT == 0)) ||
    fail "slurmd-restart under greedy: exit $LAST_RC, $LAST_OK ranks ok, $LAST_LEFT left: $(tail -5 "$ERR")"
done

# A node dies under the step: under greedy the step must end and srun too (exit 125, the
# node named), leaving nothing on the hosts left. Its slurmd is started again after.
host=n$((2 + RANDOM % (NODES - 1)))
for mpi in greedy pmix; do
  run_case node-killed "$mpi" "$host"
  [[ $mpi == pmix ]] || { ((LAST_RC == 125 && LAST_LEFT == 0)) && [[ $LAST_END != never* ]]; } ||
    fail "node-killed under greedy: srun ended after $LAST_END s, exit $LAST_RC, $LAST_LEFT left: $(tail -5 "$ERR")"
  "$TC" restart-slurmd "$host"
done

echo "| fault | --mpi | host | told after s | ranks on the other hosts gone after s | srun ended after s | srun exit | ranks ok | left |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
pass "$NODES hosts, ranks sleeping ${nap} s: mpi/greedy ended every fault and left nothing"
