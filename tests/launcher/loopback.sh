# Sourced by the tests that run greedyrun's agents on this machine, each at a loopback address
# of its own (tests/launcher/pmix-scale.sh, tasks-bench.sh, tests/parsl/parsl.sh).
# loopback_rsh DIR: writes DIR/localsh, a fake remote shell that ignores the host and starts
# the agent here. loopback_hosts N [SLOTS]: the host list 127.1.0.1,127.1.0.2,… (`:SLOTS` each).
# loopback_bench NAME (the benchmarks, tasks-bench.sh and job-cost.sh; needs tests/lib.sh):
# builds greedyrun (release) as $BIN, makes a scratch dir $work with
# the fake remote shell, and sets an EXIT trap that ends $session (the script's session, if it
# started one) and removes $work.
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
