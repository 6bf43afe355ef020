"""Real ``celery beat`` and ``celery worker`` processes for multi-process tests: the shared
harness of benchmarks/procs.py (on the path through conftest.py), with the test apps of
tests/support/apps on the processes' ``PYTHONPATH``."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

from procs import CeleryProcs, Proc, read_records  # noqa: E402

APPS = os.path.join(os.path.dirname(__file__), "apps")

__all__ = ["APPS", "Cluster", "Proc", "read_executions"]


class Cluster(CeleryProcs):
    """Processes of one test, sharing an environment; every process is stopped by :meth:`stop`."""

    def __init__(self, tmpdir: str, env: dict, app: str = "integration_app") -> None:
        super().__init__(tmpdir, dict(env), app, (APPS,))

    @property
    def tmpdir(self) -> str:
        return self.workdir


#: the JSON lines a test app's tasks appended to a file, oldest first
read_executions = read_records
