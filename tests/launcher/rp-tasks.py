"""MPI tasks through RADICAL-Pilot (PyPI) for tests/launcher/mpi-tasks-bench.sh.

usage: rp-tasks.py TASKS PROGRAM CORES SANDBOX SPANS
TASKS has one line per task, its ranks first. One pilot of CORES cores on the resource
`bench.localhost` (the bench writes its config: fake nodes of the bench's slots, MPI tasks
launched by the `mpiexec` first on $RP_BENCH_MPI). Prints the makespan in ms, from the tasks'
submission (the pilot already active) to the last one's end; writes each task's ranks, launch
start and stop (seconds from the submission, from its profile) to SPANS.
"""
import sys
import time

import radical.pilot as rp
import radical.utils as ru

tasks_file, program, cores, sandbox, spans_file = sys.argv[1:6]
ranks = [int(line.split()[0]) for line in open(tasks_file) if line.strip()]
session = rp.Session()
try:
    pmgr, tmgr = rp.PilotManager(session=session), rp.TaskManager(session=session)
    pilot = pmgr.submit_pilots(rp.PilotDescription({
        'resource': 'bench.localhost', 'cores': int(cores), 'runtime': 120,
        'sandbox': sandbox}))
    tmgr.add_pilots(pilot)
    pilot.wait(rp.PMGR_ACTIVE)
    descriptions = [rp.TaskDescription({
        'executable': program, 'ranks': r, 'environment': {'EXPECT_SIZE': str(r)}})
        for r in ranks]
    t0 = time.time()
    tasks = tmgr.submit_tasks(descriptions)
    tmgr.wait_tasks()
    ms = (time.time() - t0) * 1000
    failed = [t.uid for t in tasks if t.state != rp.DONE]
    if failed:
        sys.exit(f'rp: {len(failed)} tasks failed, first {failed[0]}')
    with open(spans_file, 'w') as out:
        for t, r in zip(tasks, ranks):
            events = {}
            for line in open(f'{ru.Url(t.sandbox).path}/{t.uid}.prof'):
                stamp, name = line.split(',')[:2]
                events.setdefault(name, float(stamp))
            start, stop = events['launch_start'], events['launch_stop']
            out.write(f'{r} {start - t0} {stop - t0}\n')
    print(int(ms))
finally:
    session.close(download=False)
