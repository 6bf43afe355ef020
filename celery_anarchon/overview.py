"""The status of one namespace as plain data, at the path docs/production.md published:
:func:`overview` lives in :mod:`celery_anarchon.operate.overview`."""
from celery_anarchon.operate.overview import overview

__all__ = ["overview"]
