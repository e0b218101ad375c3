# Sourced by the tests that run greedyrun's agents on this machine, each at a loopback address
# of its own (tests/launcher/pmix-scale.sh, tasks-bench.sh, session-load.sh, session-clients.sh,
# tests/parsl/parsl.sh).
# loopback_rsh DIR: writes DIR/localsh, a fake remote shell that ignores the host and starts
# the agent here. loopback_hosts N [SLOTS]: the host list 127.1.0.1,127.1.0.2,… (`:SLOTS` each).
# loopback_bench NAME (the benchmarks, tasks-bench.sh and job-cost.sh; needs tests/lib.sh):
# builds greedyrun (release) as $BIN, makes a scratch dir $work with
# the fake remote shell, and sets an EXIT trap that ends $session (the script's session, if it
# started one) and removes $work.
# loopback_session DIR N SLOTS [OPTION...] (needs tests/lib.sh, $BIN the build's directory):
# starts a session of N loopback pseudo-hosts of SLOTS slots each through DIR/localsh, with
# GREEDY_SESSION exported and an at_exit that ends it; SESSION_PID is the session's process.
loopback_rsh() {
  printf '#!/bin/sh\n# fake remote shell: ignore the host, start the agent here\nshift\nexec sh -c "exec $*"\n' >"$1/localsh"
  chmod +x "$1/localsh"
}
loopback_hosts() {
  awk -v n="$1" -v s="${2:-}" 'BEGIN {
    for (i = 0; i < n; i++)
      printf "%s127.1.%d.%d%s", (i ? "," : ""), int(i / 250), i % 250 + 1, (s == "" ? "" : ":" s)
  }'
}
loopback_bench() {
  cd "$ROOT"
  build --release -p greedy-launcher
  BIN=$BIN/greedyrun
  work=$(mktemp -d "/var/tmp/greedy-$1.XXXXXX")
  session=""
  trap loopback_cleanup EXIT
  loopback_rsh "$work"
}
loopback_cleanup() {
  [[ -z $session ]] || GREEDY_SESSION=$session "$BIN" --end-session >/dev/null 2>&1 || true
  rm -rf "$work"
}
loopback_session() {
  local dir=$1 n=$2 slots=$3 out
  shift 3
  loopback_rsh "$dir"
  out=$("$BIN/greedyrun" --rsh "$dir/localsh" -H "$(loopback_hosts "$n" "$slots")" --progress 0 "$@" --start-session)
  eval "$out"
  at_exit '"$BIN/greedyrun" --end-session >/dev/null 2>&1'
  [[ -n ${GREEDY_SESSION:-} ]] || fail "no session: $out"
  SESSION_PID=$(pgrep -f "^$BIN/greedyrun .*--start-session" | while read -r p; do
    [[ $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -c "^GREEDY_SESSION_SERVE=") == 1 ]] && echo "$p"
  done | head -1)
  [[ -n $SESSION_PID ]] || fail "the session's process was not found"
}
