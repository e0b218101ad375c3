"""Parsl launcher that starts a block's worker pools through greedy (``greedyrun``).

Like Parsl's ``SrunLauncher`` or ``MpiExecLauncher``, :class:`GreedyLauncher` wraps the
command a provider runs for a block (the HighThroughputExecutor's worker pool) so that it runs
``tasks_per_node`` times on each of the block's ``nodes_per_block`` nodes. It runs them as a
task stream, ``greedyrun --tasks -``: one line per copy, each placed in a free slot of the hosts
(``tasks_per_node`` slots per host). greedyrun takes the hosts of the batch allocation it runs
in (Slurm, PBS, LSF, Grid Engine) unless ``overrides`` names them, and starts one agent per
host along the greedy tree. When ``GREEDY_SESSION`` is set (``eval $(greedyrun
--start-session ...)``), the copies run on that session's agents with no new remote shell.
"""

import shlex

from parsl.launchers.base import Launcher

__all__ = ["GreedyLauncher"]


class GreedyLauncher(Launcher):
    """Starts ``tasks_per_node`` copies of the command on each node of a block through greedyrun.

    Parameters
    ----------
    greedyrun : str
        The greedyrun command (a path, or a name on ``PATH``).
    overrides : str
        More greedyrun options, e.g. ``"--hosts n[1-8]"`` or ``"--rsh rsh"``.
    debug : bool
        Print what the launch script does.
    """

    def __init__(self, debug: bool = True, greedyrun: str = "greedyrun", overrides: str = ""):
        super().__init__(debug=debug)
        self.greedyrun = greedyrun
        self.overrides = overrides

    def __call__(self, command: str, tasks_per_node: int, nodes_per_block: int, script_dir: str = "") -> str:
        copies = tasks_per_node * nodes_per_block
        return """set -e
SCRIPT_DIR={script_dir}
[[ -d $SCRIPT_DIR ]] || SCRIPT_DIR=""
CMD=${{SCRIPT_DIR:-${{TMPDIR:-/tmp}}}}/greedy_parsl_cmd_$$.sh
cat << 'GREEDY_PARSL_EOF' > "$CMD"
{command}
GREEDY_PARSL_EOF
chmod a+x "$CMD"
[[ "{debug}" == "1" ]] && echo "greedy-parsl: {copies} copies, {tasks_per_node} per node, of $CMD"
for ((i = 0; i < {copies}; i++)); do echo "bash $CMD"; done |
  {greedyrun} --ppn {tasks_per_node} {overrides} --tasks -
""".format(
            script_dir=shlex.quote(script_dir),
            command=command,
            debug=int(self.debug),
            copies=copies,
            tasks_per_node=tasks_per_node,
            greedyrun=shlex.quote(self.greedyrun),
            overrides=self.overrides,
        )
