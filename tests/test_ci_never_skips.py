"""Under ``CI=true`` a test that lacks what it needs fails; on a developer machine it is skipped.

CI must never pass by skipping (tests/conftest.py). Each case runs one real test of the suite in
a pytest of its own, with one thing taken away as a machine could lack it: ``redis-server`` off
the PATH, the Redis 8 binary of .ci/redis8.sh not built, selenium not installed, a store's client
library not installed. Each is run twice, with and without ``CI=true``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (case, the test to run, how the machine lacks it)
CASES = {
    "redis-server": "tests/system/test_ha_redis.py::test_a_replica_that_is_down_does_not_stop_the_schedule",
    "redis-8": "tests/system/test_ha_redis.py::test_restart_from_an_rdb_snapshot_never_rewins[idmp]",
    "selenium": "tests/operate/test_web.py::test_the_page_shows_the_cluster_and_a_pause_from_it_stops_the_entry",
    "client-library": "tests/stores/test_store_contract.py::test_winner_is_recognised_on_retry[nats]",
}

#: a plugin that makes the modules it names fail to import, as when they are not installed
BLOCKER = "import os, sys\nfor name in os.environ['BLOCKED_MODULES'].split(','):\n    sys.modules[name] = None\n"


def _lacking(case: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a pytest run on a machine that lacks ``case``."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    (tmp_path / "blocker.py").write_text(BLOCKER)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["BLOCKED_MODULES"] = "_nothing_"
    if case == "redis-server":
        bin_dir = tmp_path / "bin"                   # only python: no redis-server on the PATH
        bin_dir.mkdir()
        (bin_dir / "python3").symlink_to(sys.executable)
        env["PATH"] = str(bin_dir)
    elif case == "redis-8":
        env["XDG_CACHE_HOME"] = str(tmp_path / "empty-cache")   # .ci/redis8.sh never ran
    elif case == "selenium":
        env["BLOCKED_MODULES"] = "selenium"
    elif case == "client-library":
        env["BLOCKED_MODULES"] = "nats"
    return env


def _outcome(test: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "blocker", "-p", "no:randomly",
         "-p", "no:cacheprovider", "-q", "-rfs", "--no-header", test],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    counts = dict((kind, int(n)) for n, kind in
                  re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout))
    assert sum(counts.values()) == 1, f"one test ran: {counts}\n{done.stdout[-3000:]}"
    (outcome,) = counts
    return outcome


@pytest.mark.parametrize("case", list(CASES))
def test_a_test_lacking_what_it_needs_fails_under_ci_and_is_skipped_elsewhere(case, tmp_path):
    env = _lacking(case, tmp_path)
    assert _outcome(CASES[case], env) == "skipped", "a developer machine skips it"
    # in the test or in its fixture (pytest's "error"): either makes the run exit 1
    assert _outcome(CASES[case], {**env, "CI": "true"}) in ("failed", "error"), "CI fails it"
