"""Run the test suite (or a selection) several times in random order and print every test that
failed at least once, with its failure: a verdict that depends on the machine's speed or on the
order of the tests shows up here before it reaches CI.

::

    python benchmarks/flake_hunt.py                      # the whole suite, 3 runs
    python benchmarks/flake_hunt.py -n 5 --hog -- tests/beat/test_engine.py -k lease
    python benchmarks/flake_hunt.py --seeds 1,2,3        # replay given random-order seeds
    python benchmarks/flake_hunt.py -n 3 --hog-runs 1    # the last of the 3 runs under the hog

Each run is ``pytest`` in random order (pytest-randomly, which also reseeds ``random`` before each
test) with a seed of its own, printed before the run and in the summary: ``--seeds`` replays
them, as does ``pytest -p randomly -p no:cacheprovider --randomly-seed=SEED`` with the same
selection. The arguments after ``--`` go to pytest (files, ``-k``, ``-x``...). ``--hog`` keeps
one core busy with a process that spins (``while True: pass``) at the runs' own priority, as a
loaded CI machine would. ``--keep DIR`` keeps each run's output and JUnit file there.

The exit code is 0 when every run passed, 1 otherwise (a test failed or errored in some run, or
a run stopped without a test's verdict: a collection error, an interruption).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the lines of a failure's text printed in the summary (its end: the assertion and its place)
TAIL_LINES = 15


@dataclasses.dataclass
class Failure:
    """One test's failures over the runs: the seeds of the runs it failed in, and the first
    failure's kind (``failure``, ``error``: in a fixture), message and text."""

    seeds: list[int]
    kind: str
    message: str
    text: str


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """The pytest node id of a JUnit test case: ``tests.test_x`` + ``test_y[p]`` ->
    ``tests/test_x.py::test_y[p]`` (``tests.test_x.TestC`` -> ``tests/test_x.py::TestC::...``:
    the longest prefix of the class name that is a file under ``root`` is the module)."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return "::".join([("/".join(parts) + ".py") if parts else "?", name])


def failures_of(junit: Path, root: Path = ROOT) -> dict[str, tuple[str, str, str]]:
    """``{node id: (kind, message, text)}`` of the failed and errored tests of one JUnit file
    (empty when the run wrote none)."""
    out: dict[str, tuple[str, str, str]] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            for found in case.findall(kind):
                node = node_id(case.get("classname") or "", case.get("name") or "?", root)
                out.setdefault(node, (kind, found.get("message") or "", found.text or ""))
    return out


def hog() -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def pytest_command(seed: int, junit: Path, pytest_args: list[str]) -> list[str]:
    """The pytest command of one run: random order with ``seed``, results into ``junit``."""
    return [sys.executable, "-m", "pytest", "-p", "randomly", "-p", "no:cacheprovider",
            f"--randomly-seed={seed}", f"--junitxml={junit}", *pytest_args]


def has_randomly() -> bool:
    """Whether pytest-randomly is installed (the test extra of setup.cfg has it)."""
    import importlib.util
    return importlib.util.find_spec("pytest_randomly") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--runs", type=int, default=3,
                        help="how many runs (default 3; at least as many as --seeds)")
    parser.add_argument("--hog", action="store_true", help="keep one core busy during the runs")
    parser.add_argument("--hog-runs", type=int, default=None, metavar="K",
                        help="only the last K runs under the hog (implies --hog; default: all)")
    parser.add_argument("--seeds", default="", help="comma-separated random-order seeds to replay")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep each run's output and JUnit file in DIR")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest arguments (a selection)")
    args = parser.parse_args(argv)
    if not has_randomly():
        parser.error("pytest-randomly is not installed: pip install -e '.[test]'")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    seeds += [random.SystemRandom().randrange(2 ** 32) for _ in range(args.runs - len(seeds))]
    hogged = len(seeds) if args.hog_runs is None else min(args.hog_runs, len(seeds))
    hog_from = len(seeds) - hogged if (args.hog or args.hog_runs is not None) else len(seeds)
    found: dict[str, Failure] = {}
    summary = []
    hogged_seeds = set(seeds[hog_from:])
    with tempfile.TemporaryDirectory(prefix="flake-hunt-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds):
            under_hog = i >= hog_from
            junit = folder / f"run-{i + 1}-seed-{seed}.xml"
            command = pytest_command(seed, junit, args.pytest_args)
            label = f"run {i + 1}/{len(seeds)} seed {seed}{' under a one-core CPU hog' if under_hog else ''}"
            print(f"flake hunt: {label}: {shlex.join(command[1:])}", flush=True)
            spinner = hog() if under_hog else None
            start = time.monotonic()
            try:
                if args.keep:
                    with open(folder / f"run-{i + 1}-seed-{seed}.log", "w") as log:
                        code = subprocess.call(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
                else:
                    code = subprocess.call(command, cwd=ROOT)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            took = time.monotonic() - start
            failed = failures_of(junit)
            summary.append(f"{label}: pytest exit {code}, {len(failed)} failed, {took / 60:.1f} min")
            for node, (kind, message, text) in failed.items():
                found.setdefault(node, Failure([], kind, message, text)).seeds.append(seed)
            if code != 0 and not failed:  # a collection error, an interruption, no test ran
                found[f"<run {i + 1}: pytest exit {code} without a failed test>"] = Failure(
                    [seed], "error", f"pytest exit code {code}", "")
    print("\nflake hunt summary:")
    for line in summary:
        print(f"  {line}")
    if not found:
        print(f"no test failed in {len(seeds)} run(s)")
        return 0
    print(f"\n{len(found)} test(s) failed at least once:")
    for node, failure in sorted(found.items()):
        print(f"\n{node}  [{failure.kind} in {len(failure.seeds)} of {len(seeds)} runs: "
              f"seed {', '.join(map(str, failure.seeds))}]")
        print(f"  {failure.message[:500]}")
        for line in failure.text.strip().splitlines()[-TAIL_LINES:]:
            print(f"    {line}")
    failing = list(dict.fromkeys(s for f in found.values() for s in f.seeds))
    print(f"\nreplay a run: python benchmarks/flake_hunt.py -n 1 --seeds {failing[0]}"
          f"{' --hog' if failing[0] in hogged_seeds else ''} -- {shlex.join(args.pytest_args)}"
          f"  (seeds with a failure: {', '.join(map(str, failing))})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
