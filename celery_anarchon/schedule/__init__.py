"""The schedule wing: what a slot is and when, pure and without I/O.

:mod:`~celery_anarchon.schedule.slots` (the slots of every schedule kind),
:mod:`~celery_anarchon.schedule.zones` (time zone helpers), :mod:`~celery_anarchon.schedule.timing`
(the timing rules), :mod:`~celery_anarchon.schedule.task_options` (an entry's ``apply_async``
options), :mod:`~celery_anarchon.schedule.definition` (an entry's definition as JSON),
:mod:`~celery_anarchon.schedule.as_data` (Python schedule objects and entries as that JSON) and
:mod:`~celery_anarchon.schedule.plan` (from a ``beat_schedule`` entry to its checked plan). Beat,
the worker side, the operator's commands and the stores stand on it; it stands on nothing of theirs.
"""
