"""charm4py test program for greedy's netlrts service: chares on every PE, a broadcast, reductions.

Modes (argv[1]): ok (default) prints one checked summary line; exit3 ends with charm.exit(3);
abort calls charm.abort; fail-start=R makes rank R (GREEDY_RANK under greedyrun, SLURM_PROCID
under srun) exit 5 before charm.start(). Every PE also prints one line, to check that each
process's prints reach its own output.
"""
import os
import socket
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
rank = os.environ.get("GREEDY_RANK", os.environ.get("SLURM_PROCID"))
if mode.startswith("fail-start=") and rank == mode.split("=")[1]:
    sys.exit(5)

from charm4py import Chare, Future, Group, Reducer, charm  # noqa: E402


class Worker(Chare):
    def work(self, k, total, where):
        # k arrives by broadcast; each PE contributes to a sum and to a gather of (pe, host).
        print(f"charm-e2e: pe {charm.myPe()} on {socket.gethostname()}")
        self.reduce(total, k * (charm.myPe() + 1), Reducer.sum)
        self.reduce(where, (charm.myPe(), socket.gethostname()), Reducer.gather)


def main(args):
    n = charm.numPes()
    group = Group(Worker)
    total, where = Future(), Future()
    group.work(7, total, where)
    s = total.get()
    places = where.get()
    pes = sorted(p for p, _ in places)
    hosts = sorted({h for _, h in places})
    ok = s == 7 * n * (n + 1) // 2 and pes == list(range(n))
    print(f"charm-e2e: pes={n} sum={s} hosts={len(hosts)} {'ok' if ok else 'BAD'}")
    if mode == "exit3":
        charm.exit(3)
    if mode == "abort":
        charm.abort("charm-e2e deliberate abort")
    charm.exit(0 if ok else 1)


charm.start(main)
