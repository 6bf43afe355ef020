"""Where things are, for the tests in any folder of ``tests/``: the repository, the package, the
benchmarks (their server rigs are shared with the tests), the docs and the Celery apps the tests'
processes run (``tests/support/apps``)."""
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
PACKAGE = ROOT / "celery_anarchon"
BENCHMARKS = ROOT / "benchmarks"
DOCS = ROOT / "docs"
APPS = SUPPORT / "apps"
