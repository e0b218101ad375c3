#!/usr/bin/env bash
# charm4py start-to-finish, greedyrun --pmi charm vs the wheel's charmrun (ssh), on the emulated cluster.
#
#   tests/charm/bench.sh            # RUNS=5 NODES=16 DELAY=10
#   SLURM=1 tests/charm/bench.sh    # the cluster with Slurm, and srun --mpi=greedy (charm) too
#   CSV=FILE: also append every run to FILE (delay_ms,nodes,launcher,run,ms; a header if FILE is
#   new; greedy-bench reads it)
#
# Program: tests/charm/prog.py (a Group on every PE, a broadcast, a sum and a gather, checked),
# one process per host (+p16). Each run is timed wall-clock from the login node; launchers
# alternate run by run so that load drifts hit all three alike. charmrun gets CHARMRUN_IP=login
# (the VM's own name resolves to 127.0.0.1, which inside a host is that host). Prints one
# "name median min max" line per launcher and the ratios. LAUNCHERS picks some of greedy, charmrun,
# charmrun_batch (and srun, with SLURM=1). Needs root; ~2-3 min.
set -euo pipefail

TAG=charm-bench
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
RUNS=${RUNS:-5}
NODES=${NODES:-16}
DELAY=${DELAY:-10}
CSV=$(realpath -m "${CSV:-/dev/null}")
SLURM=${SLURM:-0}
LAUNCHERS=${LAUNCHERS:-greedy charmrun charmrun_batch$( ((SLURM)) && echo " srun" || true)}

need_root
[[ $CSV == /dev/null || -s $CSV ]] || echo "delay_ms,nodes,launcher,run,ms" >"$CSV"

build --release -p greedy-launcher -p greedy-netdelay
source "$ROOT/tests/charm/charm4py.sh"
UP=(--nodes "$NODES" --delay "$DELAY")
if ((SLURM)); then
  build --release -p greedy-slurm-mpi
  PLUGDIR=$CARGO_TARGET_DIR/charm-plugindir
  mkdir -p "$PLUGDIR"
  cp "$BIN/libmpi_greedy.so" "$PLUGDIR/mpi_greedy.so.new"
  mv "$PLUGDIR/mpi_greedy.so.new" "$PLUGDIR/mpi_greedy.so"
  UP+=(--slurm --plugindir "$PLUGDIR")
fi

cluster_up "${UP[@]}"
eval "$("$TC" env)"
wait_sshd "$NODES"
WORK=$GREEDY_TC_SCRATCH/charm-bench
mkdir -p "$WORK"
cd "$WORK"
cp "$ROOT/tests/charm/prog.py" prog.py
{
  echo "group main"
  for i in $(seq "$NODES"); do echo "host n$i"; done
} >nodelist
EXPECT="pes=$NODES sum=$((7 * NODES * (NODES + 1) / 2)) hosts=$NODES ok"

GREEDY=("$BIN/greedyrun" --timeout 60 --progress 0 --pmi charm --hosts "n[1-$NODES]" -n "$NODES" -- "$CHARM/bin/python" "$WORK/prog.py")
CHARMRUN=(env CHARMRUN_IP=10.123.1.1 "$CHARM/bin/python" -m charmrun.start +p"$NODES" ++nodelist nodelist ++remote-shell ssh)
cmd() {
  case $1 in
    greedy) CMD=("${GREEDY[@]}") ;;
    charmrun) CMD=("${CHARMRUN[@]}" "$WORK/prog.py") ;;
    charmrun_batch) CMD=("${CHARMRUN[@]}" ++batch 4 "$WORK/prog.py") ;;
    srun) CMD=(env SLURM_GREEDY_PROTOCOL=charm srun -N"$NODES" -n"$NODES" --mpi=greedy "$CHARM/bin/python" "$WORK/prog.py") ;;
  esac
}

declare -A T
for r in $(seq "$RUNS"); do
  for name in $LAUNCHERS; do
    cmd "$name"
    t0=$(ms)
    out=$(timeout 120 "${CMD[@]}" 2>&1 </dev/null) || fail "$name run $r: exit $?: $out"
    t=$(($(ms) - t0))
    grep -q "$EXPECT" <<<"$out" || fail "$name run $r: output: $out"
    T[$name]+="$t "
    echo "$DELAY,$NODES,$name,$r,$t" >>"$CSV"
    echo "charm-bench: $name run $r: $t ms"
    sleep 2
  done
done
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {printf "%d %d %d", a[int((NR+1)/2)], a[1], a[NR]}'; }
for name in $LAUNCHERS; do
  echo "charm-bench: $name median/min/max ms: $(med "${T[$name]}")"
done
[[ -n ${T[greedy]:-} ]] || exit 0
g=$(med "${T[greedy]}" | cut -d' ' -f1)
for name in $LAUNCHERS; do
  [[ $name == greedy ]] && continue
  c=$(med "${T[$name]}" | cut -d' ' -f1)
  echo "charm-bench: $name / greedy = $(awk -v c="$c" -v g="$g" 'BEGIN {printf "%.2f", c / g}')"
done
