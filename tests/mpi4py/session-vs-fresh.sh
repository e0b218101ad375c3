#!/usr/bin/env bash
# Is a job on a greedyrun session slower than a fresh greedyrun job? mpi4py 4.1.2's
# communication-heavy modules (test_cco_buf, test_p2p_buf) on Open MPI 5, 2 ranks on two loopback
# pseudo-hosts (tests/launcher/loopback.sh), the same job fresh and on a session started once,
# in pairs whose order alternates (fresh first, then session first), so that the load other
# processes put on the machine's cores falls on both alike. Prints each pair's wall times and
# ratio, the geometric mean of the ratios, and the CPU the session's daemon and agents used
# while all the jobs ran (what a busy-polling agent would steal from the ranks). --together
# runs each pair's two jobs at the same time instead (4 ranks on the 2 cores), so that both
# see exactly the same load.
# usage: tests/mpi4py/session-vs-fresh.sh [--together] [REPS] (pairs, default 8)
set -euo pipefail

TAG="session-vs-fresh"
# shellcheck source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$ROOT/tests/mpi/clients.sh"
. "$ROOT/tests/launcher/loopback.sh"
. "$ROOT/tests/mpi4py/install.sh"

together=0
[[ ${1:-} != --together ]] || { together=1 && shift; }
reps=${1:-8}
cd "$ROOT"
build -p greedy-launcher
G=$BIN/greedyrun
mpi4py_tests
impi_venv
work=$(mktemp -d /var/tmp/greedy-session-vs-fresh.XXXXXX)
session=""
cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$G" --end-session >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
loopback_rsh "$work"
hosts=$(loopback_hosts 2 1)
env=(OPAL_PREFIX="$OMPI5" OMPI_MCA_pml=ob1 "OMPI_MCA_btl=self,sm,tcp" OMPI_MCA_btl_tcp_if_include=lo
  MPI4PY_LIBMPI="$OMPI5/lib/libmpi.so.40")
runner=("$IMPI/bin/python" "$ROOT/tests/mpi4py/runner.py" "$M4T")
modules=(60 -i '^test_(cco_buf|p2p_buf)\.py$')

eval "$("$G" --rsh "$work/localsh" -H "$hosts" --progress 0 --start-session)"
session=${GREEDY_SESSION:?the session did not start}
unset GREEDY_SESSION
# The session's own processes: its daemon (greedyrun) and the agents it started.
daemon=$(pgrep -f -- "$work/localsh .*--start-session" || true)
[[ -n $daemon ]] || fail "the session's daemon is not found"
ticks() {
  local p
  for p in "$daemon" $(pgrep -P "$daemon"); do cat "/proc/$p/stat"; done | awk '{t += $14 + $15} END {print t}'
}

# run MODE: one job, fresh or on the session; prints its wall ms.
run() {
  local t0 log=$work/$1.log
  rm -f "$log".*
  t0=$(ms)
  if [[ $1 == fresh ]]; then
    timeout 120 env "${env[@]}" "$G" --rsh "$work/localsh" -H "$hosts" --progress 0 -n 2 "${runner[@]}" "$log" "${modules[@]}"
  else
    timeout 120 env "${env[@]}" GREEDY_SESSION="$session" "$G" --progress 0 -n 2 "${runner[@]}" "$log" "${modules[@]}"
  fi >"$work/$1.out" 2>&1 || fail "$1 job failed; its output ends:
$(tail -20 "$work/$1.out")"
  [[ $(grep -c '^pass' "$log.0") -gt 0 ]] || fail "$1 job: no test passed"
  echo $(($(ms) - t0))
}

c0=$(ticks)
t0=$(ms)
logsum=0
for i in $(seq "$reps"); do
  if ((together)); then
    run fresh >"$work/f.ms" & a=$!
    run session >"$work/s.ms" & b=$!
    wait "$a" || exit 1
    wait "$b" || exit 1
    f=$(<"$work/f.ms") s=$(<"$work/s.ms")
  elif ((i % 2)); then f=$(run fresh) s=$(run session); else s=$(run session) f=$(run fresh); fi
  r=$(awk -v s="$s" -v f="$f" 'BEGIN {printf "%.2f", s / f}')
  logsum=$(awk -v a="$logsum" -v r="$r" 'BEGIN {print a + log(r)}')
  echo "$TAG: pair $i: fresh $f ms, session $s ms, session/fresh $r (load $(cut -d' ' -f1 /proc/loadavg))"
done
cpu=$(awk -v t="$(($(ticks) - c0))" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", t / hz}')
echo "$TAG: session/fresh geometric mean $(awk -v a="$logsum" -v n="$reps" 'BEGIN {printf "%.2f", exp(a / n)}') over $reps pairs"
echo "$TAG: the session's daemon and agents used $cpu s of CPU in $((($(ms) - t0) / 1000)) s ($reps session jobs started)"
