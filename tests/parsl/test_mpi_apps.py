"""Parsl's MPI apps (PyPI Parsl's MPIExecutor) on a greedy session: one worker pool
(SimpleLauncher, as the MPIExecutor requires), Parsl's own `mpiexec -n N -ppn P -hosts ...`
prefix (PARSL_MPI_PREFIX) run by greedyrun under the name `mpiexec`, so each MPI app is a job
of the session on its agents. Every app's ranks wire up (tests/mpi/wireup.c checks its size
and does an allreduce) on the hosts Parsl named.

Run by tests/parsl/parsl.sh with GREEDY_SESSION set, `mpiexec` (greedyrun) first on PATH,
PBS_NODEFILE naming the session's hosts and HELLO the MPI program."""

import os
import sys

import parsl
from parsl.config import Config
from parsl.executors import MPIExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider


@parsl.bash_app
def hello(program, ranks, parsl_resource_specification=None, stdout=None, stderr=None):
    return "EXPECT_SIZE={} $PARSL_MPI_PREFIX {}".format(ranks, program)


def main():
    run_dir = os.environ.get("PARSL_RUN_DIR", "runinfo")
    config = Config(
        executors=[
            MPIExecutor(
                label="greedy-mpi",
                address="127.0.0.1",
                max_workers_per_block=2,
                mpi_launcher="mpiexec",
                provider=LocalProvider(
                    launcher=SimpleLauncher(),
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
    specs = [
        {"num_nodes": 2, "ranks_per_node": 2},
        {"num_nodes": 1, "ranks_per_node": 2},
        {"num_nodes": 2, "ranks_per_node": 1},
    ] * 2
    with parsl.load(config):
        futures = []
        for i, spec in enumerate(specs):
            ranks = spec["num_nodes"] * spec["ranks_per_node"]
            out = os.path.join(run_dir, "hello-{}.out".format(i))
            err = os.path.join(run_dir, "hello-{}.err".format(i))
            app = hello(os.environ["HELLO"], ranks, parsl_resource_specification=spec, stdout=out, stderr=err)
            futures.append((ranks, out, err, app))
        for ranks, out, err, f in futures:
            try:
                f.result(timeout=120)
            except Exception as e:
                said = open(err).read() if os.path.exists(err) else ""
                sys.exit("an MPI app failed: {}\n{}".format(e, said))
            text = open(out).read()
            for r in range(ranks):
                line = "rank {} of {}: ok".format(r, ranks)
                assert line in text, (line, text, open(err).read())
    print("parsl: ok: {} MPI apps ran as jobs of the session".format(len(specs)))


if __name__ == "__main__":
    sys.exit(main())
