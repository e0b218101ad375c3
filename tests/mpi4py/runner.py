"""mpi4py's own test program (test/main.py) with a result log per rank, for tests/mpi4py/suite.sh.

usage: python runner.py TESTDIR LOGPREFIX TIMEOUT [main.py OPTIONS...]

Each rank appends to LOGPREFIX.RANK one line per event, flushed as it happens: "start ID"
when a test begins, then "pass|fail|error|skip|xfail|xpass ID SECONDS" when it ends, and
"done" when the run is over. A rank that stays in one test for TIMEOUT seconds (a spawn or an
accept nobody serves) dumps its Python stack to stderr and exits 1 (faulthandler's watchdog
thread works while the main thread is blocked inside MPI), so the log's last "start" names
the test that hung.
"""

import faulthandler
import sys
import time
import unittest


def main():
    testdir, prefix, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sys.path.insert(0, testdir)
    sys.dont_write_bytecode = True
    import main as mpi4py_main  # noqa: PLC0415 (mpi4py's test/main.py, after sys.path is set)

    started, logs = [0.0], []

    def log():
        # Opened at the first test: main.py initialises MPI (with its thread options) first.
        if not logs:
            from mpi4py import MPI  # noqa: PLC0415

            rank = MPI.COMM_WORLD.Get_rank()
            logs.append(open(f"{prefix}.{rank}", "a", encoding="utf-8"))  # noqa: SIM115
        return logs[0]

    def name(test):
        # One word: "setUpClass (test_x.Case)", a class fixture's error, loses its space.
        return test.id().replace(" ", "")

    def note(word, test):
        if word == "start":
            started[0] = time.monotonic()
            log().write(f"start {name(test)}\n")
        else:
            log().write(f"{word} {name(test)} {time.monotonic() - started[0]:.3f}\n")
        log().flush()

    class Result(unittest.TextTestResult):
        """Logs every test's start and outcome; arms the hang watchdog while a test runs."""

        def startTest(self, test):
            note("start", test)
            faulthandler.dump_traceback_later(timeout, exit=True)
            super().startTest(test)

        def stopTest(self, test):
            faulthandler.cancel_dump_traceback_later()
            super().stopTest(test)

        def addSuccess(self, test):
            note("pass", test)
            super().addSuccess(test)

        def addFailure(self, test, err):
            note("fail", test)
            super().addFailure(test, err)

        def addError(self, test, err):
            note("error", test)
            super().addError(test, err)

        def addSubTest(self, test, subtest, err):
            # A failed subtest fails its test, which then gets no addSuccess.
            if err is not None:
                note("fail" if issubclass(err[0], self.failureException) else "error", test)
            super().addSubTest(test, subtest, err)

        def addSkip(self, test, reason):
            note("skip", test)
            super().addSkip(test, reason)

        def addExpectedFailure(self, test, err):
            note("xfail", test)
            super().addExpectedFailure(test, err)

        def addUnexpectedSuccess(self, test):
            note("xpass", test)
            super().addUnexpectedSuccess(test)

    class Runner(unittest.TextTestRunner):
        resultclass = Result

    sys.argv = [f"{testdir}/main.py", *sys.argv[4:]]
    try:
        mpi4py_main.main(module=None, testRunner=Runner)
    finally:
        # The run was complete: a rank killed in between tests leaves no "done".
        if logs:
            log().write("done\n")
            log().flush()


main()
