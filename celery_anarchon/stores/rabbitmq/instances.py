"""Instance records (heartbeats) of the RabbitMQ store: the
:class:`~celery_anarchon.stores.entry_store.Instances` part of
:class:`~celery_anarchon.stores.rabbitmq.RabbitMQStore`.

AMQP 0-9-1 can neither list queues nor keep only the last message of a key (classic queues have
no last-value semantics), so the records are a log that readers fold:

* **Records.** One durable classic queue per namespace, ``<prefix>.instances.<namespace>``. Each
  heartbeat publishes a persistent message (publisher confirms) with a per-message TTL of its
  ``ttl_ms``: the broker drops it that long after queueing it, on the broker's clock. Leaving
  publishes a tombstone for the instance. A reader takes every message unacked (``basic.get``
  until the queue is empty: a classic queue drops expired messages as they reach its head, so an
  expired record is never delivered) and gives them back in place (``basic.reject``, requeue),
  under the exclusive queue ``<prefix>.lock.<namespace>.!instances``, so two readers never see a
  half-empty queue (the history queues' pattern). The last message of each instance id wins; a
  tombstone removes it. A record's ``seen_ms`` is the writing instance's clock (AMQP exposes no
  broker clock) and ``expires_ms`` is ``seen_ms`` + its ttl on that clock, while the record's
  expiry itself is the broker's. Cost of a read: one round trip per message, about
  ``ttl / sync interval`` (3) messages per live instance. ``x-max-length`` 10,000 (oldest dropped)
  bounds the queue if heartbeats ever outpace expiry.
* **Fingerprint mappings.** One queue per digest, ``<prefix>.fingerprints.<namespace>.<digest>``
  (one message, first writer wins: equal digests mean equal mappings), deleted by the broker a day
  after its last use (``x-expires``); an instance whose heartbeat names a mapping it saved declares
  the queue again every 12 hours, so it lives as long as a live record names it. Read unacked and
  requeued under the same lock.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import amqp

from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores.entry_store import Instances, InstanceRecord
from celery_anarchon.stores.rabbitmq.connection import (
    CLASSIC, ONE_MESSAGE, QueueNames, Session, decode,
)

#: the instance records queue: at most this many messages, the oldest dropped first
MAX_RECORD_MESSAGES = 10_000
INSTANCES_ARGUMENTS = {**CLASSIC, "x-max-length": MAX_RECORD_MESSAGES, "x-overflow": "drop-head"}
#: a fingerprints queue is deleted this long after its last use, ms
FINGERPRINTS_EXPIRES_MS = 24 * 3600 * 1000
FINGERPRINTS_ARGUMENTS = {**ONE_MESSAGE, "x-expires": FINGERPRINTS_EXPIRES_MS}
#: an instance declares the mapping its heartbeat names again after this long, seconds
FINGERPRINTS_REFRESH_S = 12 * 3600.0
#: a tombstone's TTL when this store object never wrote the instance's record, ms
DEFAULT_TOMBSTONE_TTL_MS = 60_000
_RECORD_FIELDS = ("instance_id", "host", "pid", "version", "started_ms", "last_tick_ms",
                  "skew_ms", "entries", "fingerprints_digest")


def _local_ms() -> int:
    return int(time.time() * 1000)


class RabbitMQInstances(Instances):
    """The instance records of one RabbitMQ store (module docstring); every method raises
    :class:`~celery_anarchon.errors.StoreUnavailable` as the store's do.

    :param names: the namespace's queue names.
    :param safe_url: the masked URL (for messages).
    :param claim_timeout: seconds each confirm or lock may take.
    :param using: ``using(doing)``: the store's session as a context manager (locked, errors
        translated, the session dropped on error).
    :param queue_lock: ``queue_lock(session, name, what, held_for)``: hold an exclusive queue.
    :param monotonic: elapsed-time clock, seconds (when a mapping was last declared).
    """

    def __init__(self, *, names: QueueNames, safe_url: str, claim_timeout: float,
                 using: Callable[[str], Any], queue_lock: Callable[..., Any],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.names = names
        self.safe_url = safe_url
        self.claim_timeout = claim_timeout
        self._using = using
        self._queue_lock = queue_lock
        self._monotonic = monotonic
        self._ttl_ms: dict[str, int] = {}        # instance id -> the ttl this store wrote it with
        self._declared: dict[str, float] = {}    # digest -> when this store declared its queue

    # -- plumbing -----------------------------------------------------------------------------
    def _publish(self, s: Session, queue: str, body: dict, arguments: dict, *,
                 expiration_ms: int | None = None, refused_ok: bool = False) -> None:
        """Declare ``queue`` and publish ``body`` to it, waiting for the confirm.

        :raises StoreUnavailable: not confirmed (refused, unless ``refused_ok``).
        """
        ch = s.channel()
        ch.queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)
        ch.close()
        confirms = s.confirms()
        tag = confirms.publish(queue, body, expiration_ms=expiration_ms)
        confirms.wait(self.claim_timeout)
        if queue in confirms.returned:
            s.retire_confirms()
            raise StoreUnavailable(f"RabbitMQ store {self.safe_url}: queue {queue!r} vanished "
                                   "while it was written")
        if not confirms.acked(tag) and not refused_ok:
            raise StoreUnavailable(f"RabbitMQ store {self.safe_url}: the broker refused a "
                                   f"message to queue {queue!r}")

    def _lock(self, s: Session):
        return self._queue_lock(s, self.names.instances_lock(), "the instance records",
                                "the instance records or a fingerprint mapping")

    # -- Instances --------------------------------------------------------------------------
    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Publish this instance's heartbeat; the broker drops it ``ttl_ms`` after queueing it.
        Declares the queue of the mapping it names again when due (module docstring)."""
        ttl_ms = max(1, int(ttl_ms))
        body = {f: getattr(record, f) for f in _RECORD_FIELDS}
        body.update(ttl_ms=ttl_ms, seen_ms=_local_ms(), refused=record.refused)
        digest = record.fingerprints_digest
        declared = self._declared.get(digest)
        with self._using("recording the instance") as s:
            self._publish(s, self.names.instances(), body, INSTANCES_ARGUMENTS,
                          expiration_ms=ttl_ms)
            if declared is not None and self._monotonic() - declared > FINGERPRINTS_REFRESH_S:
                ch = s.channel()
                ch.queue_declare(self.names.fingerprints(digest), durable=True,
                                 auto_delete=False, arguments=FINGERPRINTS_ARGUMENTS)
                ch.close()
                self._declared[digest] = self._monotonic()
        self._ttl_ms[record.instance_id] = ttl_ms

    def instances(self) -> list[InstanceRecord]:
        """The records the broker still holds, the last of each instance, by instance id."""
        with self._using("reading the instances") as s:
            bodies = s.ensure(lambda: self._read(s))
        latest: dict[str, dict | None] = {}
        for body in bodies:
            iid = body.get("instance_id")
            if isinstance(iid, str):
                latest[iid] = None if body.get("gone") else body
        out = []
        for body in latest.values():
            if body is None:
                continue
            try:
                fields = {f: body[f] for f in _RECORD_FIELDS}
                seen, ttl = int(body["seen_ms"]), int(body["ttl_ms"])
            except (KeyError, TypeError, ValueError):
                continue                     # not a record of this version: ignored
            out.append(InstanceRecord(**fields, seen_ms=seen, expires_ms=seen + ttl,
                                      refused=body.get("refused")))   # optional: older have none
        return sorted(out, key=lambda r: r.instance_id)

    def _read(self, s: Session) -> list[dict]:
        queue = self.names.instances()
        with self._lock(s):
            ch = s.channel()
            ch.queue_declare(queue, durable=True, auto_delete=False, arguments=INSTANCES_ARGUMENTS)
            messages = []
            while len(messages) < MAX_RECORD_MESSAGES:
                message = ch.basic_get(queue, no_ack=False)
                if message is None:
                    break
                messages.append(message)
            for message in messages:
                ch.basic_reject(message.delivery_tag, requeue=True)
            ch.close()  # synchronous: every message is back before the lock is released
        return [body for body in map(decode, messages) if body is not None]

    def remove_instance(self, instance_id: str) -> None:
        """Publish a tombstone for the instance (it outlives the record it hides)."""
        ttl_ms = self._ttl_ms.get(instance_id, max(self._ttl_ms.values(),
                                                   default=DEFAULT_TOMBSTONE_TTL_MS))
        with self._using("removing the instance") as s:
            self._publish(s, self.names.instances(), {"instance_id": instance_id, "gone": True},
                          INSTANCES_ARGUMENTS, expiration_ms=ttl_ms)

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep the mapping under ``digest`` (a refused publish: it is there already)."""
        with self._using("saving fingerprints") as s:
            self._publish(s, self.names.fingerprints(digest),
                          {"digest": digest, "fingerprints": dict(fingerprints)},
                          FINGERPRINTS_ARGUMENTS, refused_ok=True)
        self._declared[digest] = self._monotonic()

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, ``None`` if unknown."""
        queue = self.names.fingerprints(digest)

        def read() -> dict | None:
            with self._lock(s):
                ch = s.channel()
                try:
                    ch.queue_declare(queue, passive=True)
                except amqp.exceptions.NotFound:
                    return None
                message = ch.basic_get(queue, no_ack=False)
                if message is not None:
                    ch.basic_reject(message.delivery_tag, requeue=True)
                ch.close()
            body = decode(message) if message is not None else None
            mapping = (body or {}).get("fingerprints")
            return dict(mapping) if isinstance(mapping, dict) else None
        with self._using("loading fingerprints") as s:
            return s.ensure(read)
