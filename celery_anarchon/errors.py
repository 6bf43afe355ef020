"""Exceptions raised by celery_anarchon.

Every message names what is wrong (the entry, the setting, the value) and how to fix it.
"""


class ConfigError(ValueError):
    """An unsafe or invalid configuration, raised when beat starts (or when a store is opened).

    It is a :class:`ValueError`, so code that already guards Celery's own configuration errors
    keeps working. Failing at start-up beats running a job twice at 3 a.m.
    """


class UnknownEntry(ConfigError):
    """No entry of that name: not in ``beat_schedule``, not in the store."""


class EntryExists(ConfigError):
    """An entry of that name exists already (``add`` of a name in the store or in ``beat_schedule``)."""


class EntryOwnedByConfig(ConfigError):
    """The entry is defined in ``beat_schedule``: change it there (pause, resume and run-now work
    on it; update and remove do not)."""


class RequestRefused(ConfigError):
    """A run-now request id the store can no longer vouch for: an id that carries its creation
    time (a UUIDv7, as the API, the command line and the status page make them) made before the
    store's memory of run-now requests began (a new store, one that lost its data, ids pruned
    after ``anarchon_request_retention``), or more than the store-side tolerance ahead of its
    clock. Nothing is written: the store cannot tell whether that request ran, so it does not
    run it again (docs/schedules.md, "What each operation guarantees")."""


class StoreError(Exception):
    """A store operation failed. Beat logs it and retries; it never sends without a won claim."""


class StoreUnavailable(StoreError):
    """The store could not be reached, or did not answer within ``claim_timeout`` seconds.

    The outcome of an operation that raised this is unknown: a claim is retried, and the store
    recognises its own winner (docs/design.md "Who won").
    """


class StoreNotReached(StoreUnavailable):
    """The store could not be reached before an operation of the schedules API wrote anything
    (its first contact, the store's preparation, failed): nothing was changed, and repeating
    the operation is safe. The message names the store (its URL masked) and the fix."""


class SendOutcomeUnknown(Exception):
    """A publish broke off after the message may have reached the broker (the connection dropped
    or timed out while the message was written or its answer awaited).

    The winner does not publish the run again: a second publish could deliver it twice, and a run
    is sent at most once per attempt (docs/design.md "The guarantee"). The run is recorded
    ``send_unknown``; a leased run whose message never reached a worker is taken over after its
    queue deadline.
    """


class LeaseLost(Exception):
    """Raised by :meth:`celery_anarchon.current_lease().check() <celery_anarchon.worker.leases.Lease.check>`
    when the run's lease was taken over by another attempt (the runner was presumed dead)."""
