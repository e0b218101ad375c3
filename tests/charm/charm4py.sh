# Sourced by the Charm++ tests: sets CHARM (a venv holding the charm4py 1.1 wheel from PyPI,
# default /var/tmp/greedy-charm4py: /var/tmp is visible to every emulated host, /tmp is not) and
# installs it on first use. Needs tests/lib.sh.
CHARM=${GREEDY_CHARM4PY:-/var/tmp/greedy-charm4py}
if ! "$CHARM/bin/python" -c 'import charm4py' >/dev/null 2>&1; then
  echo "${0##*/}: installing PyPI charm4py 1.1 into $CHARM"
  python3 -m venv "$CHARM" || fail "python3 -m venv $CHARM"
  "$CHARM/bin/pip" install -q charm4py==1.1 || fail "pip install charm4py==1.1"
fi
