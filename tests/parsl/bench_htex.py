"""Parsl's HighThroughputExecutor, its worker pools started by greedy-parsl's GreedyLauncher on
the emulated cluster's hosts: N bash apps of COMMAND, timed from the first submission to the
last result once every pool is connected (a warm-up round of one app per worker first).
Prints `parsl-bench: N tasks in S s`.

Run by tests/launcher/tasks-cluster-bench.sh with GREEDYRUN, HOSTS (a hostlist), NODES,
WORKERS (per node), ADDRESS (the interchange's, reachable from the hosts), N, COMMAND and
PARSL_RUN_DIR set."""

import os
import sys
import time

import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from greedy_parsl import GreedyLauncher


@parsl.bash_app
def task(command):
    return command


def main():
    nodes, workers, n = int(os.environ["NODES"]), int(os.environ["WORKERS"]), int(os.environ["N"])
    command = os.environ["COMMAND"]
    launcher = GreedyLauncher(
        greedyrun=os.environ["GREEDYRUN"],
        overrides="--hosts {} --progress 0".format(os.environ["HOSTS"]),
        debug=False,
    )
    config = Config(
        executors=[
            HighThroughputExecutor(
                label="bench",
                address=os.environ["ADDRESS"],
                max_workers_per_node=workers,
                provider=LocalProvider(
                    launcher=launcher,
                    nodes_per_block=nodes,
                    init_blocks=1,
                    min_blocks=1,
                    max_blocks=1,
                    worker_init="",
                ),
            )
        ],
        run_dir=os.environ.get("PARSL_RUN_DIR", "runinfo"),
        strategy="none",
    )
    with parsl.load(config):
        for f in [task(command) for _ in range(nodes * workers)]:
            assert f.result(timeout=300) == 0
        t0 = time.monotonic()
        futures = [task(command) for _ in range(n)]
        failed = sum(1 for f in futures if f.result(timeout=600) != 0)
        wall = time.monotonic() - t0
    assert failed == 0, "{} tasks failed".format(failed)
    print("parsl-bench: {} tasks in {:.3f} s".format(n, wall))


if __name__ == "__main__":
    sys.exit(main())
