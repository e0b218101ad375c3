#!/usr/bin/env bash
# Open MPI past 500 hosts (issue 19, item 1), on the emulated cluster with a per-hop delay: the
# MPI hello (tests/mpi/wireup.c: Init, Allreduce, Barrier, Finalize) of Debian's Open MPI 4.1
# and of the PyPI Open MPI 5 wheel (its own OpenPMIx client), one rank per host, started with no
# protocol flag (tests/mpi/clients.sh's commands) by greedyrun, or with --slurm by
# `srun --mpi=greedy` on as many slurmd. A run passes only if every rank printed its check
# (size, rank, allreduce) and the launcher exited 0. Prints one markdown row per client: wall
# time, the machine's CPU seconds (every host shares its 2 cores) and, under greedyrun, when its
# last agent said hello. Each client's stdout and stderr are kept in $OMPI_SCALE_OUT (default
# $CARGO_TARGET_DIR/ompi-scale).
# usage: tests/launcher/ompi-scale.sh [--hosts 600] [--delay MS] [--slurm] [--clients "ompi4 ompi5"]
# Waits for another engineer's cluster to go down (never tears it down). ≈ 10 min at 600.
set -euo pipefail

# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
hosts=600 delay=10 slurm=0 clients="ompi4 ompi5"
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --slurm) slurm=1; shift ;;
    --clients) clients=$2; shift 2 ;;
    *) echo "usage: $0 [--hosts N] [--delay MS] [--slurm] [--clients LIST]" >&2; exit 2 ;;
  esac
done
. "$ROOT/tests/launcher/cluster-bench.sh"
. "$ROOT/tests/mpi/clients.sh"

if ((slurm)); then
  # mpi_greedy.so built and installed in $PLUGDIR as the Slurm MPI tests do it.
  . "$ROOT/tests/slurm/mpi-build.sh"
  cluster_up --nodes "$hosts" --delay "$delay" --slurm --plugindir "$PLUGDIR"
  launcher=(srun -N"$hosts" --mpi=greedy)
else
  cluster_up --nodes "$hosts" --delay "$delay"
  # Open MPI's ranks poll in MPI_Init while they wait, and all 600 hosts share 2 cores: with
  # the ranks of the first hosts polling, the last hosts' ssh handshakes starved (at 60 s 26
  # agents were not up; with 300 s, sshd dropped one). rsh hops cost far less CPU, and the
  # launch gets half a second per host past 120 (its default is 60 s). What is checked here is
  # the PMIx job.
  launcher=("$BIN/greedyrun" -v --progress 0 --rsh rsh --timeout $((hosts > 120 ? hosts / 2 : 60))
    --hostfile hosts --)
fi
eval "$("$TC" env)"
((slurm)) || wait_sshd "$hosts"
W=$GREEDY_TC_SCRATCH/ompi-scale
OUT=${OMPI_SCALE_OUT:-$CARGO_TARGET_DIR/ompi-scale}
mkdir -p "$W" "$OUT"
cd "$W"
for client in $clients; do client_build "$client" "$W"; done
for i in $(seq "$hosts"); do echo "n$i"; done >hosts

echo "| client | hosts | launch to finish | CPU-s | last agent up | ranks ok |"
echo "|---|---|---|---|---|---|"
failed=0
for client in $clients; do
  client_cmd "$client" "$W"
  settle
  j0=$(busy_jiffies)
  t0=$(ms)
  set +e
  timeout $((2 * hosts)) "${launcher[@]}" env EXPECT_SIZE="$hosts" "${CMD[@]:1}" \
    >"$client.out" 2>"$client.err" </dev/null
  rc=$?
  set -e
  wall=$(($(ms) - t0))
  cp "$client.out" "$client.err" "$OUT/"
  cpu=$(awk -v a="$j0" -v b="$(busy_jiffies)" 'BEGIN {printf "%.0f", (b - a) / 100}')
  ok=$(grep -c "of $hosts: ok" "$client.out" || true)
  up=$(sed -n 's/.*agents up after \([0-9.]*\) s.*/\1 s/p' "$client.err")
  echo "| $client | $hosts | $((wall / 1000)).$((wall % 1000 / 100)) s | $cpu | ${up:--} | $ok/$hosts (exit $rc) |"
  if ((rc != 0 || ok != hosts)); then
    failed=1
    echo "ompi-scale: $client failed; the end of ${launcher[0]##*/}'s stderr:" >&2
    tail -n 20 "$client.err" >&2
  fi
done
((failed == 0)) || fail "see above"
echo "ompi-scale: every rank of $clients checked on $hosts hosts under ${launcher[0]##*/}"
