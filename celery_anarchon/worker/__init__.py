"""The worker wing: what runs in Celery workers.

:mod:`~celery_anarchon.worker.leases` (adopt, renew by heartbeat and release a leased run's lease,
:func:`celery_anarchon.install`, :func:`celery_anarchon.current_lease`) and
:mod:`~celery_anarchon.worker.metrics` (the worker's lease metrics). It never imports beat or the
operator's wing: a worker process loads no scheduler.
"""
