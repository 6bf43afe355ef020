"""The beat wing: what runs inside ``celery beat``.

:mod:`~celery_anarchon.beat.scheduler` (Celery's ``Scheduler`` interface),
:mod:`~celery_anarchon.beat.publisher` (the broker side: connection, producer, send batches),
:mod:`~celery_anarchon.beat.entries` (the plans of beat_schedule's entries and of the store's),
:mod:`~celery_anarchon.beat.engine` (the life of a run on one instance, free of Celery) and
:mod:`~celery_anarchon.beat.metrics` (beat's Prometheus metrics). It never imports the worker or
the operator's wing.
"""
