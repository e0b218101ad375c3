"""Real Parsl (PyPI) through greedy-parsl's GreedyLauncher: a HighThroughputExecutor whose
block of 2 nodes starts its worker pools with greedyrun on two loopback pseudo-hosts (a fake
remote shell starts each agent on this machine). Every app runs, and both hosts' pools served.

Run by tests/parsl/parsl.sh with GREEDYRUN, GREEDY_RSH (the fake shell) and HOSTS set."""

import os
import sys

import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from greedy_parsl import GreedyLauncher


@parsl.python_app
def where(i):
    import os
    return i, os.environ.get("GREEDY_NODE"), os.environ.get("GREEDY_TASK")


def main():
    hosts = os.environ["HOSTS"]
    launcher = GreedyLauncher(
        greedyrun=os.environ["GREEDYRUN"],
        overrides="--rsh {} -H {} --progress 0".format(os.environ["GREEDY_RSH"], hosts),
    )
    run_dir = os.environ.get("PARSL_RUN_DIR", "runinfo")
    config = Config(
        executors=[
            HighThroughputExecutor(
                label="greedy",
                address="127.0.0.1",
                max_workers_per_node=2,
                provider=LocalProvider(
                    launcher=launcher,
                    nodes_per_block=2,
                    init_blocks=1,
                    min_blocks=1,
                    max_blocks=1,
                    worker_init="",
                ),
            )
        ],
        run_dir=run_dir,
        strategy="none",
    )
    with parsl.load(config):
        results = [where(i).result(timeout=120) for i in range(40)]
    got = sorted(r[0] for r in results)
    assert got == list(range(40)), got
    nodes = {r[1] for r in results}
    # Each host's pool is one task of the stream, on its own agent.
    assert nodes == {"0", "1"}, nodes
    print("parsl: ok: 40 apps on the worker pools of {} hosts started by greedyrun".format(len(nodes)))


if __name__ == "__main__":
    sys.exit(main())
