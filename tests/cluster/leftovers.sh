# Sourced by the Slurm cluster tests: what a finished step may leave behind. Set JOB_RE (a bash
# regex of the step's command lines, slurmstepd included: a step must end entirely); needs
# tests/lib.sh.

# The processes of any emulated host whose command line matches JOB_RE, as ns:pid:cmd; ...
leftovers() {
  local ns pid cmd out=""
  for ns in $(ip netns list | awk '/^gtc-n/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
      [[ $cmd =~ $JOB_RE ]] && out+="$ns:$pid:$cmd; "
    done
  done
  echo "$out"
}
# no_leftovers NAME: polls up to 20 s (KillWait=5 plus stepd teardown on 2 busy cores).
no_leftovers() {
  local left _i
  for _i in $(seq 100); do
    left=$(leftovers)
    [[ -z $left ]] && return 0
    sleep 0.2
  done
  fail "$1: processes left behind: $left"
}
