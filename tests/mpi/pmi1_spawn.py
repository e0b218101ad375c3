"""pmi1_spawn.py: a PMI-1 client that spawns, without an MPI library (the wire of MPICH's
PMI_Spawn_multiple: one `mcmd=spawn` block, one `cmd=spawn_result` reply).

    pmi1_spawn.py NPROCS PROGRAM [ARG...]   rank 0 (every rank with SPAWN_ALL=1, at once)
                                            spawns NPROCS copies of PROGRAM ARGS and prints
                                            `spawn rc=R msg=M took=S`; every rank then
                                            finalizes and exits 0
    pmi1_spawn.py child [CODE [HOLD]]       a spawned child: prints `child NSPACE rank R of N`,
                                            finalizes; rank 0 exits CODE (0), the others print
                                            `bye R` after HOLD seconds (1) and exit 0

PMI_FD comes from the launcher (a child without one skips PMI); GREEDY_JOB, GREEDY_RANK and
GREEDY_SIZE name the process.
"""
import os
import sys
import time

fd = int(os.environ.get("PMI_FD", "-1"))
buf = b""


def send(text):
    os.write(fd, text.encode())


def reply():
    """The next reply line as a dict."""
    global buf
    while b"\n" not in buf:
        chunk = os.read(fd, 4096)
        if not chunk:
            sys.exit(f"pmi1_spawn: the PMI socket closed (read {buf!r})")
        buf += chunk
    line, buf = buf.split(b"\n", 1)
    return dict(w.split("=", 1) for w in line.decode().split() if "=" in w)


def finalize():
    if fd >= 0:
        send("cmd=finalize\n")
        reply()


if fd >= 0:
    send("cmd=init pmi_version=1 pmi_subversion=1\n")
    reply()
rank = int(os.environ["GREEDY_RANK"])
args = sys.argv[1:]
if args[0] == "child":
    size = os.environ["GREEDY_SIZE"]
    print(f"child {os.environ['GREEDY_JOB']} rank {rank} of {size}", flush=True)
    finalize()
    if rank == 0:
        sys.exit(int(args[1]) if len(args) > 1 else 0)
    time.sleep(float(args[2]) if len(args) > 2 else 1)
    print(f"bye {rank}", flush=True)
    sys.exit(0)
if rank == 0 or os.environ.get("SPAWN_ALL") == "1":
    nprocs, program, rest = args[0], args[1], args[2:]
    lines = ["mcmd=spawn", f"nprocs={nprocs}", f"execname={program}", "totspawns=1",
             "spawnssofar=1", f"argcnt={len(rest)}"]
    lines += [f"arg{i + 1}={a}" for i, a in enumerate(rest)]
    lines += ["preput_num=0", "info_num=0", "endcmd"]
    t0 = time.monotonic()
    send("\n".join(lines) + "\n")
    r = reply()
    took = time.monotonic() - t0
    print(f"spawn rc={r.get('rc')} msg={r.get('msg', '')} took={took:.1f}", flush=True)
finalize()
