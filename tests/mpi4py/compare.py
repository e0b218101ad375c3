"""Compares mpi4py's per-test results under greedy with a baseline launcher's (tests/mpi4py/suite.sh).

usage: python3 compare.py WORKDIR EXCEPTIONS CONFIG=BASELINE...

WORKDIR holds runner.py's logs, CONFIG.rROUND.log.RANK. A test's result in a configuration is
the worst over its ranks in the last round that ran it: "died" (started, never finished: it hung past the per-test timeout
or its job died), then error, fail, xpass, skip, pass (xfail counts as pass); "missing" when
it never started (suite.sh runs a test that died once more: a death in an earlier round is
reported as a flake, by name, and does not count). Prints a table of counts per configuration and every test that passes under
a configuration's BASELINE but not under the configuration. Exits 1 when such a test is not
listed in EXCEPTIONS, or when a listed exception passes now (the list must stay true); tests
a run left out (--xfile) are not judged.

EXCEPTIONS: "TEST-ID CONFIG REASON…" per line, # comments; TEST-ID and CONFIG may be
fnmatch patterns (test_spawn.*, greedy-*).
"""

import collections
import fnmatch
import pathlib
import re
import sys

WORST = ["died", "error", "fail", "xpass", "skip", "pass"]
LOG = re.compile(r"^(?P<config>.+)\.r(?P<round>\d+)\.log\.(?P<rank>\d+)$")


def results(workdir):
    """{config: {test: result}}: a test's result is from the last round that ran it (an earlier
    one may have ended under it while another rank hung elsewhere), the worst over its ranks."""
    per_rank = collections.defaultdict(dict)  # (config, round, rank) -> {test: word}
    for path in sorted(workdir.iterdir()):
        m = LOG.match(path.name)
        if not m:
            continue
        seen = per_rank[(m["config"], int(m["round"]), m["rank"])]
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            word, _, rest = line.partition(" ")
            if word == "done":
                continue
            test = rest.split(" ")[0]
            seen[test] = "died" if word == "start" else ("pass" if word == "xfail" else word)
    last = collections.defaultdict(dict)  # config -> {test: last round}
    for (config, rnd, _rank), seen in per_rank.items():
        for test in seen:
            last[config][test] = max(rnd, last[config].get(test, 0))
    out = collections.defaultdict(dict)
    flakes = collections.defaultdict(dict)  # config -> {test: round it died in, not its last}
    for (config, rnd, _rank), seen in per_rank.items():
        for test, word in seen.items():
            if rnd == last[config][test]:
                old = out[config].get(test, "pass")
                out[config][test] = min(old, word, key=WORST.index)
            elif word == "died":
                flakes[config][test] = rnd
    return out, flakes


def exceptions(path):
    """[(test pattern, config pattern, reason, line number)]."""
    rules = []
    for n, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            sys.exit(f"{path}:{n}: expected TEST-ID CONFIG REASON, got {line!r}")
        rules.append((parts[0], parts[1], parts[2], n))
    return rules


def listed(rules, test, config):
    for rule in rules:
        if fnmatch.fnmatchcase(test, rule[0]) and fnmatch.fnmatchcase(config, rule[1]):
            return rule
    return None


def main():
    workdir, xpath = pathlib.Path(sys.argv[1]), sys.argv[2]
    pairs = [arg.split("=", 1) for arg in sys.argv[3:]]
    (res, flakes), rules, bad = results(workdir), exceptions(xpath), []
    print(f"{'configuration':<16}" + "".join(f"{w:>7}" for w in WORST))
    for config in dict.fromkeys(c for pair in pairs for c in reversed(pair)):
        counts = collections.Counter(res.get(config, {}).values())
        print(f"{config:<16}" + "".join(f"{counts[w]:>7}" for w in WORST))
    for config, baseline in pairs:
        base, got = res.get(baseline, {}), res.get(config, {})
        if not base:
            sys.exit(f"compare: the baseline {baseline} ran no test")
        for test in sorted(t for t, r in base.items() if r == "pass"):
            r = got.get(test, "missing")
            if r == "pass":
                continue
            rule = listed(rules, test, config)
            if rule:
                print(f"  {config}: {test}: {r} (listed: {rule[2]})")
            else:
                bad.append(f"{config}: {test}: {r} under greedy, pass under {baseline}, not listed")
        for test, r in sorted(got.items()):
            rule = listed(rules, test, config)
            if rule and r == "pass":
                bad.append(f"{config}: {test} passes now; remove or narrow {xpath}:{rule[3]}")
    for config, tests in sorted(flakes.items()):
        for test, rnd in sorted(tests.items()):
            print(f"  FLAKE: {config}: {test}: died in round {rnd}, {res[config][test]} when run again")
    for line in bad:
        print(f"FAIL: {line}")
    sys.exit(1 if bad else 0)


main()
