# shellcheck shell=bash
# tests/lib.sh: the preamble of every test, benchmark and test helper under tests/. A script
# sets TAG if its messages name it otherwise than its file name, then
#   # shellcheck source=../lib.sh
#   . "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# and gets ROOT (the checkout), TC (slurm-conf/testcluster), CARGO_TARGET_DIR exported
# (default $ROOT/target) and these functions:
#   fail MSG…         "TAG: FAIL: MSG" on stderr, exit 1 (TAG: the script's name without .sh)
#   pass MSG…         "TAG: ok: MSG"
#   ms                the time in milliseconds
#   need_root         fail "must run as root" unless root (the cluster is network namespaces)
#   need_shared_target  fail when CARGO_TARGET_DIR is under /tmp, which the emulated hosts do
#                     not see (each has a private /tmp)
#   build [--slurm R] CARGO-ARGS…  cargo build -q --locked from $ROOT, failing by name; sets BIN
#                     to the profile's directory of what it built, and exports GREEDY_NETDELAY
#                     (unless set) when it built greedy-netdelay. --slurm R: against Slurm
#                     release R's Debian root (slurm-conf/release-root --build-env) into
#                     $CARGO_TARGET_DIR/slurm-R
#   release_select R  RELEASE=R and RELEASE_ROOT: that release's Debian root (built on first
#                     use, cached in /var/tmp/greedy-roots), empty for the machine's own Slurm
#   cluster_claim ARGS…  `testcluster up ARGS…` once the machine's one cluster is free (waits
#                     while another engineer's is up or starting), no trap
#   cluster_up ARGS…  cluster_claim, then an EXIT trap that takes our cluster down
#   at_exit CMD       CMD (eval'd) runs in that trap first: to end what a test started in the
#                     background (a client on the login node outlives the cluster)
#   cluster_wait      waits the same way without bringing anything up (the smoke tests, which
#                     test `up` and `down` themselves)
#   wait_sshd N       hosts n1..nN answer ssh
#   wait_idle         every Slurm node idle again
# Topic helpers that tests share (tests/cluster/leftovers.sh, tests/charm/charm4py.sh,
# tests/slurm/mpi-build.sh, tests/launcher/{loopback,cluster-bench}.sh, tests/mpi/*.sh,
# tests/security/stranger.sh) are sourced after this file and rely on it.
#
# Not sourced by scripts/test, scripts/demo, scripts/install-deps and scripts/fuzz: they are the
# user's entry points and must read alone (install-deps runs before anything is installed,
# test and demo run from a fresh checkout with their own CARGO_TARGET_DIR rule: a target dir
# under /tmp is moved to /var/tmp/greedy-target, where tests here refuse one), and fuzz is no
# cluster test.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TC=$ROOT/slurm-conf/testcluster
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TAG=${TAG:-$(basename "$0" .sh)}

fail() {
  echo "$TAG: FAIL: $*" >&2
  exit 1
}
pass() { echo "$TAG: ok: $*"; }
ms() {
  local t=${EPOCHREALTIME/./}
  echo $((t / 1000))
}
# median: the middle of the numbers on stdin (spaces or newlines between them); of an even count
# the lower middle one, so whole milliseconds stay whole.
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# run_timed NAME TIMEOUT CMD...: CMD, stdin /dev/null, under a TIMEOUT-second guard, its output
# kept in $WORK/NAME.out and .err; sets RC, OUT, ERR and SECS.
run_timed() {
  local name=$1 limit=$2 t0
  shift 2
  t0=$(ms)
  set +e
  timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" </dev/null
  RC=$?
  set -e
  SECS=$(awk -v a="$t0" -v b="$(ms)" 'BEGIN { printf "%.2f", (b - a) / 1000 }')
  OUT=$(cat "$WORK/$name.out")
  ERR=$(cat "$WORK/$name.err")
}
need_root() { [[ $EUID -eq 0 ]] || fail "must run as root"; }
need_shared_target() {
  [[ $CARGO_TARGET_DIR != /tmp/* ]] || fail "CARGO_TARGET_DIR under /tmp is not visible to the hosts"
}

build() {
  local release="" dir=$CARGO_TARGET_DIR profile=debug a
  if [[ ${1:-} == --slurm ]]; then
    release=$2 dir=$CARGO_TARGET_DIR/slurm-$2
    shift 2
  fi
  for a in "$@"; do
    [[ $a == --release ]] && profile=release
  done
  if [[ -n $release ]]; then
    (cd "$ROOT" && eval "$("$ROOT/slurm-conf/release-root" --build-env "$release")" &&
      CARGO_TARGET_DIR=$dir cargo build -q --locked "$@") || fail "cargo build $* for Slurm $release"
  else
    (cd "$ROOT" && cargo build -q --locked "$@") || fail "cargo build $*"
  fi
  BIN=$dir/$profile
  if [[ " $* " == *" greedy-netdelay "* && -z ${GREEDY_NETDELAY:-} ]]; then
    export GREEDY_NETDELAY=$BIN/greedy-netdelay
  fi
}

# shellcheck disable=SC2034 # RELEASE_ROOT is the caller's
release_select() {
  RELEASE=$1 RELEASE_ROOT=""
  [[ $RELEASE =~ ^(22\.05|24\.11|26\.05)$ ]] || {
    echo "${0##*/}: --release $RELEASE: expected 22.05, 24.11 or 26.05" >&2
    exit 2
  }
  local v
  v=$(/usr/sbin/slurmd -V 2>/dev/null || true)
  v=${v##* }
  [[ $RELEASE == "${v%.*}" ]] || RELEASE_ROOT=$("$ROOT/slurm-conf/release-root" "$RELEASE") ||
    { echo "${0##*/}: no Debian root for Slurm $RELEASE" >&2; exit 1; }
}

# --- the emulated cluster: one a machine, shared by every engineer's tests -----------------
# Busy: a cluster is up, or another engineer's `up` is still running (status says "down" until
# up has finished, so look at the state dir and the namespaces too).
cluster_busy() {
  "$TC" status >/dev/null 2>&1 || [[ -e ${GREEDY_TC_STATE:-/run/greedy-testcluster} ]] ||
    ip netns list | grep -q '^gtc-' || pgrep -f 'slurm-conf/testcluster (up|down)' >/dev/null
}
# Free only if it stays free for 10 s: another engineer's script may be between two clusters.
cluster_busy_settled() {
  local _i
  for _i in 1 2 3 4 5; do
    cluster_busy && return 0
    sleep 2
  done
  return 1
}
# Waits (GREEDY_CLAIM_WAITS × 20 s, default 90 = 30 min: benchmarks hold it for long) while
# another engineer's cluster is up or starting.
cluster_wait() {
  local _i
  for _i in $(seq "${GREEDY_CLAIM_WAITS:-90}"); do
    cluster_busy_settled || return 0
    echo "${0##*/}: another test cluster is up or starting; waiting 20 s for it to go down"
    sleep 20
  done
  fail "another test cluster stayed up for $((${GREEDY_CLAIM_WAITS:-90} / 3)) minutes; not touching it"
}
# Brings our cluster up once it is free, and goes back to waiting if one came up between our
# check and our `up` (`up` exits 2 on a running cluster and leaves it alone). Sets no trap: for
# scripts that take and release the cluster several times (route-bench.sh).
cluster_claim() {
  local _i rc retried=0
  for _i in $(seq "${GREEDY_CLAIM_WAITS:-90}"); do
    if ! cluster_busy_settled; then
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
# now, never for a cluster of others; from $ROOT, as down deletes the scratch dir).
AT_EXIT=()
at_exit() { AT_EXIT+=("$1"); }
cluster_up() {
  cluster_claim "$@"
  trap 'for c in "${AT_EXIT[@]}"; do eval "$c" || true; done; cd "$ROOT"; "$TC" down >/dev/null 2>&1 || true' EXIT
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
# kill_host NODE: every process of the host's namespaces but the one that keeps them, all
# stopped first: as in a crash, none sees another die (an agent would report its ranks killed).
kill_host() {
  local keeper p pids=()
  read -r keeper _ <"$GREEDY_TC_STATE/pids/$1.keeper"
  for p in $(ip netns pids "gtc-$1"); do
    [[ $p == "$keeper" ]] || pids+=("$p")
  done
  kill -STOP "${pids[@]}" 2>/dev/null || true
  kill -KILL "${pids[@]}" 2>/dev/null || true
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
