"""Check a Celery app's schedule in its own test suite, before it is deployed.

The public face of :mod:`celery_anarchon.operate.checks` (the same checks as
``celery anarchon check`` and ``next``)::

    from celery_anarchon.testing import assert_schedule_ok

    def test_schedule():
        assert_schedule_ok(app)          # raises AssertionError listing every problem
"""
from celery_anarchon.operate.checks import *  # noqa: F401,F403  (the public names)
from celery_anarchon.operate.checks import __all__  # noqa: F401
