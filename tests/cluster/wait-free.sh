# Sourced by the cluster tests: wait (up to 10 min) while another test's cluster is up, since
# one machine holds one emulated cluster and tests must never tear down somebody else's.
# Needs $TC (the testcluster script) and a fail function.
for ((i = 0; i < 30; i++)); do
  "$TC" status >/dev/null 2>&1 || break
  ((i == 0)) && echo "$(basename "$0"): a test cluster is up; waiting up to 10 min for it to go down"
  sleep 20
done
# An `if`, not `status && fail`: a sourced file's last status is the `.` command's, and under
# `set -e` a free cluster's non-zero status would end the caller.
if "$TC" status >/dev/null 2>&1; then
  fail "a test cluster is still up after 10 min; not touching it"
fi
