"""The operator's wing: what an operator calls.

:mod:`~celery_anarchon.operate.schedules` (``celery_anarchon.schedules(app)``: change the schedule
at run time), :mod:`~celery_anarchon.operate.overview` (the status of a namespace as data),
:mod:`~celery_anarchon.operate.checks` (the checks behind ``celery_anarchon.testing``, ``check``
and ``next``), :mod:`~celery_anarchon.operate.web` (the status page) and
:mod:`~celery_anarchon.operate.cli` (``celery anarchon ...``). It never imports beat or the worker
wing.
"""
