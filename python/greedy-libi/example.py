"""A libgreedy tool in Python: `example.py RSH HOST:COUNT...` launches itself as one member per
slot; the master broadcasts the front end's word, every member scatters, allgathers and gathers
data whose answer it knows, and the master reports to the front end."""

import os
import sys

from greedy_libi import FrontEnd, Member


def member():
    me = Member()
    word = me.recv_from_front() if me.rank == 0 else b""
    word = me.broadcast(0, word)
    parts = [f"part{r}".encode() for r in range(me.size)] if me.rank == 0 else []
    assert me.scatter(0, parts) == f"part{me.rank}".encode()
    everyone = me.allgather(bytes([me.rank]) * 1500)
    assert everyone == [bytes([r]) * 1500 for r in range(me.size)], "allgather"
    me.barrier()
    gathered = me.gather(0, str(me.rank).encode())
    if gathered is not None:
        me.send_to_front(word + b" | " + b",".join(gathered))
    me.finalize()


def front_end(rsh, specs):
    hosts = [(h, int(n)) for h, n in (s.rsplit(":", 1) for s in specs)]
    group = {"program": sys.executable, "args": [os.path.abspath(__file__)], "hosts": hosts}
    fe = FrontEnd()
    with fe.launch([group], rsh=rsh) as session:
        session.send(b"hello from python")
        print("front end got:", session.recv(timeout=60).decode())
        code = session.wait()
    fe.close()
    return code


if __name__ == "__main__":
    if "PMI_RANK" in os.environ:
        member()
    else:
        sys.exit(front_end(sys.argv[1], sys.argv[2:]))
