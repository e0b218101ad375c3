# Sourced by cluster tests and benchmarks: cluster_up ARGS… brings the machine's one emulated
# cluster up for the caller once it is free, and sets the EXIT trap that takes it down again;
# cluster_claim ARGS… does the same without the trap.
# Needs $TC (the testcluster script) and a fail function.

# Busy: a cluster is up, or another engineer's `up` is still running (status says "down" until
# up has finished, so look at the state dir and the namespaces too).
busy() {
  "$TC" status >/dev/null 2>&1 || [[ -e ${GREEDY_TC_STATE:-/run/greedy-testcluster} ]] ||
    ip netns list | grep -q '^gtc-' || pgrep -f 'slurm-conf/testcluster (up|down)' >/dev/null
}
# Free only if it stays free for 10 s: another engineer's script may be between two clusters.
busy_settled() {
  local _i
  for _i in 1 2 3 4 5; do
    busy && return 0
    sleep 2
  done
  return 1
}
# Brings our cluster up once it is free; waits (GREEDY_CLAIM_WAITS × 20 s, default 90 = 30 min: benchmarks hold it for long)
# while another engineer's cluster is up or starting, and goes back to waiting if one came up
# between our check and our `up` (`up` exits 2 on a running cluster and leaves it alone).
# Sets no trap: for scripts that take and release the cluster several times (route-bench.sh).
cluster_claim() {
  local _i rc retried=0
  for _i in $(seq "${GREEDY_CLAIM_WAITS:-90}"); do
    if ! busy_settled; then
      set +e
      "$TC" up "$@" >/dev/null
      rc=$?
      set -e
      ((rc == 0)) && return 0
      # One retry of a failed `up` (it removed its partial cluster): on a loaded machine a
      # host's sshd or slurmd now and then dies while 64 of them start.
      if ((rc != 2 && !retried)); then
        retried=1
        echo "${0##*/}: testcluster up $* failed (exit $rc); trying once more"
        continue
      fi
      ((rc == 2)) || fail "testcluster up $*: exit $rc"
    fi
    echo "${0##*/}: another test cluster is up or starting; waiting 20 s for it to go down"
    sleep 20
  done
  fail "another test cluster stayed up for $((${GREEDY_CLAIM_WAITS:-90} / 3)) minutes; not touching it"
}
# cluster_claim, then the EXIT trap that takes our cluster down whatever happens (set only
# now, never for a cluster of others).
cluster_up() {
  cluster_claim "$@"
  trap '"$TC" down >/dev/null 2>&1 || true' EXIT
}
# wait_sshd N: every host n1..nN answers ssh (up to 10 s each): a fresh cluster's sshd may still
# be starting, and a benchmark's first timed run or calibration must not pay for (or fail on) it.
wait_sshd() {
  local i _t
  for i in $(seq "$1"); do
    for _t in $(seq 50); do
      ssh -oBatchMode=yes -oConnectTimeout=5 "n$i" true 2>/dev/null && break
      sleep 0.2
    done
  done
}
# wait_idle: every Slurm node idle again (a job's nodes come back one by one after it ends), so
# the next srun neither queues ("job N queued and waiting for resources") nor pays for the last
# job; fails naming the states left after 30 s.
wait_idle() {
  local _i st
  for ((_i = 0; _i < 600; _i++)); do
    st=$(sinfo -h -o '%T' | sort -u | tr '\n' ' ')
    [[ $st == "idle " ]] && return 0
    sleep 0.05
  done
  fail "Slurm nodes not idle after 30 s: $(sinfo -h -o '%T %D' | tr '\n' ' ')"
}
