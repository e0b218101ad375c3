# Sourced by the security tests: a second, unprivileged local user and its attack on one
# emulated host (issue 15). Needs tests/lib.sh.
#   stranger_setup       creates the user (removed again by stranger_cleanup) and installs the
#                        attack tool where every host sees it
#   stranger_attack N H LOG  runs tests/security/stranger.py as that user on host N in the
#                        background, holding its silent connections H seconds; sets
#                        STRANGER_PID and writes its report to LOG
#   stranger_wait        waits for the attack (killing it after 30 s) and checks it reached
#                        at least one port
STRANGER=greedy-stranger
STRANGER_TOOL=/var/tmp/greedy-stranger.py

# Also puts stranger_cleanup in front of the script's EXIT trap.
stranger_setup() {
  local prev
  prev=$(trap -p EXIT)
  prev=${prev#"trap -- '"}
  prev=${prev%"' EXIT"}
  # shellcheck disable=SC2064 # the previous trap's text, expanded now
  trap "stranger_cleanup; $prev" EXIT
  if ! id -u "$STRANGER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$STRANGER" ||
      fail "useradd $STRANGER"
  fi
  install -m 0755 "$ROOT/tests/security/stranger.py" "$STRANGER_TOOL"
}

stranger_cleanup() {
  pkill -KILL -u "$STRANGER" 2>/dev/null || true
  userdel "$STRANGER" 2>/dev/null || true
  rm -f "$STRANGER_TOOL"
}

# as_stranger NODE CMD...: CMD as the stranger on NODE.
as_stranger() {
  local node=$1
  shift
  # A clean environment: root's (pyenv shims under /root, the job's variables) is not theirs.
  "$TC" exec "$node" -- setpriv --reuid="$STRANGER" --regid="$STRANGER" --clear-groups -- \
    env -i PATH=/usr/bin:/bin HOME=/ "$@"
}

stranger_attack() {
  STRANGER_LOG=$3
  as_stranger "$1" python3 "$STRANGER_TOOL" "$2" >"$STRANGER_LOG" 2>&1 &
  STRANGER_PID=$!
}

stranger_wait() {
  local _i
  for _i in $(seq 150); do
    kill -0 "$STRANGER_PID" 2>/dev/null || break
    sleep 0.2
  done
  kill "$STRANGER_PID" 2>/dev/null || true
  wait "$STRANGER_PID" 2>/dev/null || true
  grep -q "^stranger: " "$STRANGER_LOG" || fail "the stranger reached no port: $(<"$STRANGER_LOG")"
}
