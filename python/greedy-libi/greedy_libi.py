"""libgreedy from Python: the LIBI interface over greedy's launch tree (ctypes over
libgreedy.so.0; the same calls as include/greedy/libi.h, docs/tool-builders.md).

A front end launches members and talks to the master (rank 0); members call collectives.
Every failure raises Error with libgreedy's message (it names the host, rank or argument).
"""

import ctypes
import ctypes.util
import os

_lib = ctypes.CDLL(os.environ.get("GREEDY_LIBI_LIBRARY", "libgreedy.so.0"))
_p = ctypes.c_void_p
_size = ctypes.c_size_t
_lib.greedy_last_error.restype = ctypes.c_char_p
_lib.greedy_member_rank.restype = ctypes.c_uint
_lib.greedy_member_size.restype = ctypes.c_uint
_lib.greedy_free.argtypes = [_p]


class Error(Exception):
    """A libgreedy call failed."""


def _check(rc):
    if rc != 0:
        raise Error(_lib.greedy_last_error().decode(errors="replace"))


def _strings(items):
    """A NULL-terminated char* array (and what keeps its strings alive)."""
    if not items:
        return None
    arr = (ctypes.c_char_p * (len(items) + 1))(*[s.encode() for s in items], None)
    return arr


def _take(buf, length):
    """Bytes from a buffer libgreedy returned, which is then freed."""
    try:
        return ctypes.string_at(buf, length) if length else b""
    finally:
        _lib.greedy_free(buf)


def _take_many(buf, lens, count):
    if not buf:
        return None
    sizes = [ctypes.cast(lens, ctypes.POINTER(_size))[i] for i in range(count)]
    data = ctypes.string_at(buf, sum(sizes))
    _lib.greedy_free(buf)
    _lib.greedy_free(lens)
    out, at = [], 0
    for n in sizes:
        out.append(data[at:at + n])
        at += n
    return out


class _Host(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("count", ctypes.c_uint)]


class _Dist(ctypes.Structure):
    _fields_ = [("program", ctypes.c_char_p), ("argv", _p), ("env", _p),
                ("hosts", ctypes.POINTER(_Host)), ("nhosts", _size)]


class _Backend(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("rsh", ctypes.c_char_p), ("session", ctypes.c_char_p),
                ("job", ctypes.c_uint), ("step", ctypes.c_int), ("bcast", _p)]


class Session:
    """A launched session: messages to and from its master, its end."""

    def __init__(self, handle):
        self._h = handle

    def send(self, data: bytes):
        _check(_lib.greedy_fe_send(self._h, data, _size(len(data))))

    def recv(self, timeout=None) -> bytes:
        """The master's next message; waits at most `timeout` seconds (None: for ever)."""
        buf, n = _p(), _size()
        ms = -1 if timeout is None else int(timeout * 1000)
        _check(_lib.greedy_fe_recv(self._h, ms, ctypes.byref(buf), ctypes.byref(n)))
        return _take(buf, n.value)

    def wait(self) -> int:
        """Waits for every member's end: the launcher's exit code (0: all exited 0)."""
        code = ctypes.c_int(0)
        _lib.greedy_fe_wait(self._h, ctypes.byref(code))
        return code.value

    def kill(self) -> int:
        code = ctypes.c_int(0)
        _check(_lib.greedy_fe_kill(self._h, ctypes.byref(code)))
        return code.value

    def close(self):
        if self._h:
            _lib.greedy_session_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FrontEnd:
    """Launches sessions: greedyrun over a remote shell (rsh=) or on a session (session=), an
    srun step (srun=True), or beside a running Slurm job (slurm_job=, step=)."""

    def __init__(self):
        self._h = _p()
        _check(_lib.greedy_fe_init(ctypes.byref(self._h)))

    def launch(self, groups, rsh=None, session=None, srun=False, slurm_job=None, step=None,
               bcast=()):
        """groups: dicts of program, args, env (a dict), hosts ([(host, count)]; empty: the
        back end's nodes, one each)."""
        keep = []
        dists = (_Dist * len(groups))()
        for d, g in zip(dists, groups):
            hosts = (_Host * max(1, len(g.get("hosts", []))))()
            for h, (name, count) in zip(hosts, g.get("hosts", [])):
                h.name, h.count = name.encode(), count
            argv = _strings(list(g.get("args", [])))
            env = _strings([f"{k}={v}" for k, v in g.get("env", {}).items()])
            keep += [hosts, argv, env]
            d.program = g["program"].encode()
            d.argv = ctypes.cast(argv, _p) if argv else None
            d.env = ctypes.cast(env, _p) if env else None
            d.hosts, d.nhosts = hosts, len(g.get("hosts", []))
        b = _Backend()
        if slurm_job is not None:
            b.kind, b.job, b.step = 3, slurm_job, -1 if step is None else step
        elif srun:
            b.kind = 2
        elif session is not None:
            b.kind, b.session = 1, session.encode()
        else:
            b.kind, b.rsh = 0, (rsh or "ssh").encode()
        files = _strings(list(bcast))
        b.bcast = ctypes.cast(files, _p) if files else None
        handle = _p()
        _check(_lib.greedy_fe_launch(self._h, dists, _size(len(groups)), ctypes.byref(b),
                                     ctypes.byref(handle)))
        return Session(handle)

    def close(self):
        if self._h:
            _lib.greedy_fe_finalize(self._h)
            self._h = None


class Member:
    """This process as a member of the session that started it."""

    def __init__(self):
        self._h = _p()
        _check(_lib.greedy_member_init(ctypes.byref(self._h)))
        self.rank = _lib.greedy_member_rank(self._h)
        self.size = _lib.greedy_member_size(self._h)

    def barrier(self):
        _check(_lib.greedy_barrier(self._h))

    def broadcast(self, root: int, data: bytes = b"") -> bytes:
        buf, n = _p(), _size()
        _check(_lib.greedy_broadcast(self._h, root, data, _size(len(data)), ctypes.byref(buf),
                                     ctypes.byref(n)))
        return _take(buf, n.value)

    def scatter(self, root: int, parts=()) -> bytes:
        ptrs = (ctypes.c_char_p * max(1, len(parts)))(*parts)
        lens = (_size * max(1, len(parts)))(*[len(p) for p in parts])
        buf, n = _p(), _size()
        _check(_lib.greedy_scatter(self._h, root, ptrs, lens, ctypes.byref(buf), ctypes.byref(n)))
        return _take(buf, n.value)

    def gather(self, root: int, data: bytes):
        """Every member's data in rank order on root; None elsewhere."""
        buf, lens = _p(), _p()
        _check(_lib.greedy_gather(self._h, root, data, _size(len(data)), ctypes.byref(buf),
                                  ctypes.byref(lens)))
        return _take_many(buf.value, lens.value, self.size)

    def allgather(self, data: bytes):
        buf, lens = _p(), _p()
        _check(_lib.greedy_allgather(self._h, data, _size(len(data)), ctypes.byref(buf),
                                     ctypes.byref(lens)))
        return _take_many(buf.value, lens.value, self.size)

    def send_to_front(self, data: bytes):
        _check(_lib.greedy_member_send_fe(self._h, data, _size(len(data))))

    def recv_from_front(self) -> bytes:
        buf, n = _p(), _size()
        _check(_lib.greedy_member_recv_fe(self._h, ctypes.byref(buf), ctypes.byref(n)))
        return _take(buf, n.value)

    def finalize(self):
        _check(_lib.greedy_member_finalize(self._h))
        self._h = None
