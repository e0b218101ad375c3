# Sourced by the benchmarks that take the emulated cluster (tests/launcher/bench.sh,
# session-bench.sh, tasks-cluster-bench.sh, ompi-scale.sh) after tests/lib.sh: builds greedyrun
# and the delayer (release), sets BIN (the release directory) and GREEDY_NETDELAY, quiets
# testcluster, and defines busy_jiffies and settle (SETTLE half-seconds at most, default 30).
export GREEDY_TC_QUIET=1
build --release -p greedy-launcher -p greedy-netdelay

busy_jiffies() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }

# Waits (up to SETTLE/2 s, default 15) until the machine is nearly idle: Open MPI's orteds and a failed run's
# ranks keep burning CPU for seconds after their launcher exits, and the next run must not pay
# for its predecessor's teardown (measured: a greedyrun run right after mpirun used 2x the CPU).
settle() {
  local a b _i
  for _i in $(seq "${SETTLE:-30}"); do
    a=$(busy_jiffies)
    sleep 0.5
    b=$(busy_jiffies)
    ((b - a < 20)) && return 0 # < 20 % of the 2 cores busy
  done
  return 0 # never idle (other work on the machine): measure anyway
}
