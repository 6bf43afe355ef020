"""Exceptions raised by celery_anarchon.

Every message names what is wrong (the entry, the setting, the value) and how to fix it.
"""


class ConfigError(ValueError):
    """An unsafe or invalid configuration, raised when beat starts (or when a store is opened).

    It is a :class:`ValueError`, so code that already guards Celery's own configuration errors
    keeps working. Failing at start-up beats running a job twice at 3 a.m.
    """


class StoreError(Exception):
    """A store operation failed. Beat logs it and retries; it never sends without a won claim."""


class StoreUnavailable(StoreError):
    """The store could not be reached, or did not answer within ``claim_timeout`` seconds.

    The outcome of an operation that raised this is unknown: a claim is retried, and the store
    recognises its own winner (DESIGN.md "Who won").
    """


class LeaseLost(Exception):
    """Raised by :meth:`celery_anarchon.current_lease().check() <celery_anarchon.leases.Lease.check>`
    when the run's lease was taken over by another attempt (the runner was presumed dead)."""
