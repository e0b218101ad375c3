"""mpi4py.futures.MPIPoolExecutor with spawned workers: a function mapped over ITEMS items.

Usage: pool.py ITEMS [WORKERS]   (run as one rank: the pool spawns WORKERS workers with
MPI_Comm_spawn, or UNIVERSE_SIZE - 1 when not given). Prints "pool: N results right from W
workers" and exits 0 when every result is right and came back in order, 1 otherwise.
"""

import os
import socket
import sys

from mpi4py.futures import MPIPoolExecutor


def work(x):
    """The item's square, and where it was computed."""
    return x * x, socket.gethostname(), os.getpid()


def main():
    items = int(sys.argv[1])
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else None
    with MPIPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(work, range(items), chunksize=8))
    right = sum(1 for x, (sq, _, _) in zip(range(items), results) if sq == x * x)
    pids = {pid for _, _, pid in results}
    print(f"pool: {right} of {items} results right from {len(pids)} workers", flush=True)
    return 0 if right == items and os.getpid() not in pids else 1


if __name__ == "__main__":
    sys.exit(main())
