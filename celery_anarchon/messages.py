"""What a task message sent by celery_anarchon carries, and how a task reads it.

Every message has Celery's ``celery_beat_task`` header plus ours, prefixed ``anarchon_`` so they
never override Celery's own headers. A task reads them as ``self.request.headers``.
"""
from __future__ import annotations

from datetime import datetime, timezone

HEADER_NAMESPACE = "anarchon_namespace"   #: the sender's anarchon_namespace
HEADER_ENTRY = "anarchon_entry"           #: the entry's name in beat_schedule
HEADER_SLOT = "anarchon_slot"             #: the run's slot, UTC ms (int)
HEADER_INSTANCE = "anarchon_instance"     #: the beat instance that won the claim and sent it
HEADER_ATTEMPT = "anarchon_attempt"       #: 1 for the first send, 2... for a takeover (leased)
HEADER_TOKEN = "anarchon_token"           #: fencing token of the attempt (leased entries)
HEADER_LEASE = "anarchon_lease"           #: lease settings, seconds (leased entries)

#: the attribute :func:`celery_anarchon.install` sets on the app whose workers read leased messages
INSTALLED_ATTR = "_anarchon_installed"


def is_installed(app) -> bool:
    """Whether :func:`celery_anarchon.install` ran for ``app``: its workers then adopt, renew and
    release the leases these messages carry (beat refuses leased entries otherwise)."""
    return bool(getattr(app, INSTALLED_ATTR, False))


def _headers_of(request) -> dict:
    request = getattr(request, "request", request)      # a bound Task works too
    headers = getattr(request, "headers", None) or {}
    if HEADER_SLOT not in headers and getattr(request, HEADER_SLOT, None) is not None:
        headers = {k: getattr(request, k, None) for k in (HEADER_NAMESPACE, HEADER_ENTRY,
                   HEADER_SLOT, HEADER_INSTANCE, HEADER_ATTEMPT, HEADER_TOKEN, HEADER_LEASE)}
    return headers


def scheduled_at(request) -> datetime | None:
    """The nominal time of the run a task is executing: its slot, an aware UTC ``datetime``.

    Use it instead of the current time: a run starts up to its jitter (and queueing) after its
    slot, and a re-sent attempt much later. ``request`` is ``self.request`` of a bound task (or
    the task itself). Returns ``None`` for a message not sent by celery_anarchon (a task called
    by hand).
    """
    slot = _headers_of(request).get(HEADER_SLOT)
    if slot is None:
        return None
    return datetime.fromtimestamp(int(slot) / 1000, tz=timezone.utc)
