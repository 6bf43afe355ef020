"""The fuzz profiles and the summary of what each property ran.

Profiles (``--hypothesis-profile NAME``; ``make test`` runs ``default``, ``make fuzz`` runs
``fuzz``):

* ``default``: derandomized (the same examples on every run: a failure replays as it is), about
  three minutes for every property together on a 2-core machine;
* ``dev`` (a quarter of the examples, no shrinking: the first failure as found) and ``hunt``
  (the default's examples, random, no shrinking): while developing;
* ``fuzz``: about ten times the examples, random (the seed is printed: ``--hypothesis-seed=N``
  replays a run), for before a release (~30 minutes).

``deadline=None``: these properties test what is answered, not how fast.
"""
from __future__ import annotations

import collections
import os
import sys
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])
#: ``max_examples`` of a profile is the scale of every property's own count (see ``budget``)
#: the examples of the default profile (each property's ``budget`` is its share of them)
DEFAULT_EXAMPLES = 400
settings.register_profile("default", max_examples=DEFAULT_EXAMPLES, derandomize=True,
                          database=None, **_COMMON)
settings.register_profile("fuzz", max_examples=10 * DEFAULT_EXAMPLES, derandomize=False,
                          **_COMMON)
#: while developing: the first failure as found, not shrunk (minutes saved on a slow property)
settings.register_profile("dev", max_examples=DEFAULT_EXAMPLES // 4, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate], **_COMMON)
settings.register_profile("hunt", max_examples=DEFAULT_EXAMPLES, derandomize=False, database=None,
                          phases=[Phase.explicit, Phase.generate], **_COMMON)

#: test id -> [examples run, seconds]
RAN: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])


def budget(examples: int) -> int:
    """A property's number of examples under the loaded profile: ``examples`` under the default
    one, ten times that under ``fuzz``, a quarter under ``dev``."""
    return max(1, examples * settings.default.max_examples // DEFAULT_EXAMPLES)


def count() -> None:
    """Count one example of the running test (for the summary)."""
    RAN[os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]][0] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = time.monotonic()
    yield
    RAN[item.nodeid][1] += time.monotonic() - start


def pytest_report_header(config):
    profile = config.getoption("hypothesis_profile", None) or "default"
    seed = config.getoption("hypothesis_seed", None)
    return (f"fuzz: hypothesis profile {profile!r} (max_examples scale "
            f"{settings.get_profile(profile).max_examples}), "
            + ("derandomized" if settings.get_profile(profile).derandomize
               else f"seed {seed if seed is not None else 'random (see hypothesis output)'}"))


def pytest_terminal_summary(terminalreporter, config):
    if not RAN:
        return
    profile = config.getoption("hypothesis_profile", None) or "default"
    terminalreporter.write_sep("-", f"fuzz properties (profile {profile!r})")
    total_n, total_s = 0, 0.0
    for test, (n, seconds) in sorted(RAN.items()):
        terminalreporter.write_line(f"{n:6d} examples {seconds:7.1f} s  {test}")
        total_n, total_s = total_n + n, total_s + seconds
    terminalreporter.write_line(f"{total_n:6d} examples {total_s:7.1f} s  in all")
