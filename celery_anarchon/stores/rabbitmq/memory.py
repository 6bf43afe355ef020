"""The memory start of each entry in the RabbitMQ store (docs/design.md "Amnesia"), and the lock
queues its readers hold: a part of :class:`~celery_anarchon.stores.rabbitmq.store.RabbitMQStore`
(its module docstring explains the design: "Amnesia", "History"), given what it needs of the
store.

* **Memory start.** A durable queue ``<prefix>.born.<namespace>.<entry>`` (no expiry, one message,
  first writer wins) holds the clock of the instance that began the entry's memory, read once
  per connection under the entry's lock.
* **Locks.** An exclusive queue held by one connection at a time (freed by the broker if that
  connection dies): ``<prefix>.lock.<namespace>.<entry>`` while an entry's memory start or
  history is read (:mod:`.history`), and the instance records' own lock (:mod:`.instances`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import amqp

from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores._common import retrying
from celery_anarchon.stores.rabbitmq.connection import ONE_MESSAGE, QueueNames, Session, decode

logger = logging.getLogger("celery_anarchon.stores.rabbitmq")

#: how soon a reader refused an entry's lock tries again, seconds (then backing off up to
#: LOCK_POLL_MAX_S; the lock is held for one read of a history or memory start)
LOCK_POLL_S = 0.01
LOCK_POLL_MAX_S = 0.1


def local_ms() -> int:
    """This instance's clock, UTC ms (AMQP exposes no broker clock)."""
    return int(time.time() * 1000)


class MemoryStarts:
    """The memory start of each entry, on its born queue, and the lock queues (module docstring).

    :param drop: ``drop()``: drop the store's session (its connection may be broken).
    """

    def __init__(self, *, names: QueueNames, namespace: str, instance_id: str, safe_url: str,
                 claim_timeout: float, drop: Callable[[], None]) -> None:
        self.names = names
        self.namespace = namespace
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.claim_timeout = claim_timeout
        self._drop = drop

    # -- locks ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def entry_lock(self, s: Session, entry: str):
        """Hold ``entry``'s exclusive lock queue: one reader of its born and history queues at a
        time, across every instance. The broker frees it if this connection dies.

        Taking it is a retry, not a wait on a condition: the broker answers the declare of an
        exclusive queue that another connection holds with RESOURCE_LOCKED (405, the channel is
        closed), and nothing tells when it is free but declaring again (backoff from
        ``LOCK_POLL_S`` to ``LOCK_POLL_MAX_S``, for ``claim_timeout`` seconds).

        :raises StoreUnavailable: still locked by another instance after ``claim_timeout``.
        """
        with self.queue_lock(s, self.names.lock(entry), f"entry {entry!r}",
                             "its memory start or history"):
            yield

    @contextlib.contextmanager
    def queue_lock(self, s: Session, name: str, what: str, held_for: str):
        """Hold the exclusive queue ``name`` (see :meth:`entry_lock`); ``what`` and ``held_for``
        name it in the error.

        :raises StoreUnavailable: still locked by another instance after ``claim_timeout``.
        """
        def take():
            ch = s.channel()
            ch.queue_declare(name, exclusive=True, auto_delete=True)
            return ch
        try:
            ch = retrying((amqp.exceptions.ResourceLocked,), deadline_s=self.claim_timeout,
                          wait_s=LOCK_POLL_S, max_wait_s=LOCK_POLL_MAX_S)(take)
        except amqp.exceptions.ResourceLocked:
            raise StoreUnavailable(
                f"RabbitMQ store {self.safe_url}: {what} stayed locked by another "
                f"instance for {self.claim_timeout:g} s (queue {name!r}, held while "
                f"{held_for} is read)") from None
        try:
            yield
        finally:
            try:
                ch.queue_delete(name)
                ch.close()
            except Exception:  # noqa: BLE001 - a lock left behind dies with the connection
                self._drop()

    # -- memory start (amnesia) -------------------------------------------------------------------
    def born(self, s: Session, entry: str) -> int:
        """When the store's memory of ``entry`` began, UTC ms (the creating instance's clock);
        creates it (now) when the broker has none. Read once per connection."""
        born = s.born.get(entry)
        if born is not None:
            return born
        queue = self.names.born(entry)
        with self.entry_lock(s, entry):
            ch = s.channel()
            ch.queue_declare(queue, durable=True, auto_delete=False, arguments=ONE_MESSAGE)
            born = self.take_born(ch, queue, keep=True)
            ch.close()  # synchronous: the requeue is done before the lock is released
            if born is None:
                born = local_ms()
                self.put_born(s, entry, born)
        s.born[entry] = born
        return born

    def take_born(self, ch, queue: str, *, keep: bool) -> int | None:
        """The born message's value (``None`` if there is none); requeued in place when ``keep``,
        else removed. Only under the entry's lock."""
        message = ch.basic_get(queue, no_ack=False)
        if message is None:
            return None
        body = decode(message) or {}
        if keep:
            ch.basic_reject(message.delivery_tag, requeue=True)
        else:
            ch.basic_ack(message.delivery_tag)
        try:
            return int(body["born_ms"])
        except (KeyError, TypeError, ValueError):
            logger.error("RabbitMQ store %s: queue %s holds no memory start (%r); using this "
                         "instance's clock", self.safe_url, queue, message.body[:200])
            return local_ms()

    def put_born(self, s: Session, entry: str, born_ms: int) -> None:
        """Write the memory start of ``entry`` (its born queue must be empty: under its lock).

        :raises StoreUnavailable: the broker did not confirm it.
        """
        confirms = s.confirms()
        tag = confirms.publish(self.names.born(entry), {
            "born_ms": int(born_ms), "instance": self.instance_id, "namespace": self.namespace,
            "entry": entry})
        confirms.wait(self.claim_timeout)
        if not confirms.acked(tag) or confirms.tainted:
            raise StoreUnavailable(f"RabbitMQ store {self.safe_url}: the memory start of entry "
                                   f"{entry!r} could not be written")
