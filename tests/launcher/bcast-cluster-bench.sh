#!/usr/bin/env bash
# One file of SIZE MB onto every host of the emulated Slurm cluster before a one-rank-per-host
# job reads it, one sitting, the runners interleaved per rep:
#   bcast    greedyrun --bcast=FILE over ssh: read once, down the greedy launch tree in 1 MiB
#            chunks each agent forwards as they arrive, SHA-256 checked on every host
#   sbcast   Slurm 22.05's sbcast inside the allocation (slurmd's own fan-out tree, TreeWidth
#            50), then an srun step that reads each host's copy
#   shared   every rank copies it from the shared file system itself (the page cache here)
#   none     the greedyrun job with no file (the launch alone)
# Each rank checks its copy's size (a short copy fails the run); every copy is removed. All
# hosts share this machine's 2 cores and one page cache: the CPU decides, not links.
# usage: tests/launcher/bcast-cluster-bench.sh [--hosts H] [--mb SIZE] [--reps K]
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
export GREEDY_TC_QUIET=1
hosts=16 mb=50 reps=3
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --mb) mb=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts H] [--mb SIZE] [--reps K]" >&2; exit 2 ;;
  esac
done
need_root
need_shared_target
build --release -p greedy-launcher
cluster_up --nodes "$hosts" --slurm
eval "$("$TC" env)"
WORK=$GREEDY_TC_SCRATCH/bcast-cluster
mkdir -p "$WORK"
cd "$WORK"
head -c "$((mb << 20))" /dev/urandom >big.bin
want=$((mb << 20))
size_is() { echo "test \$(wc -c < $1) = $want"; }
GR=("$BIN/greedyrun" --hosts "n[1-$hosts]" --rsh ssh --progress 0 --pmi none)
run() {
  case $1 in
    bcast) "${GR[@]}" --bcast=big.bin sh -c "$(size_is '"$GREEDY_BCAST/big.bin"')" ;;
    sbcast) salloc -Q -N "$hosts" bash -c "sbcast -f big.bin /tmp/big.bin &&
      srun -N $hosts --ntasks-per-node 1 sh -c '$(size_is /tmp/big.bin); rc=\$?; rm -f /tmp/big.bin; exit \$rc'" ;;
    shared) "${GR[@]}" sh -c "cp $WORK/big.bin /tmp/big.\$GREEDY_RANK && $(size_is "/tmp/big.\$GREEDY_RANK"); rc=\$?; rm -f /tmp/big.\$GREEDY_RANK; exit \$rc" ;;
    none) "${GR[@]}" true ;;
  esac >"$WORK/$1.out" 2>"$WORK/$1.err" </dev/null || fail "$1: $(tail -3 "$WORK/$1.err")"
}
declare -A walls=()
for ((k = 0; k < reps; k++)); do
  for runner in bcast sbcast shared none; do
    t0=$(ms)
    run "$runner"
    t1=$(ms)
    walls[$runner]+="$((t1 - t0)) "
    echo "bcast-cluster-bench: $hosts hosts rep $k $runner $((t1 - t0)) ms" >&2
  done
done
b=$(echo "${walls[bcast]}" | median)
echo "| ${mb} MB to $hosts hosts, then a job reads it | median wall s | vs bcast |"
echo "|---|---|---|"
for runner in bcast sbcast shared none; do
  m=$(echo "${walls[$runner]}" | median)
  case $runner in
    bcast) label="greedyrun --bcast (the greedy tree)" ;;
    sbcast) label="sbcast, then srun (slurmd's tree)" ;;
    shared) label="every rank copies it from the shared file system" ;;
    none) label="the greedyrun job alone, no file" ;;
  esac
  awk -v m="$m" -v b="$b" -v l="$label" 'BEGIN { printf "| %s | %.2f | %.2fx |\n", l, m / 1000, m / b }'
done
