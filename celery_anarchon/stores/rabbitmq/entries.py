"""The per-entry queues of the RabbitMQ store: the entry's lock, its memory start (amnesia) and
its history. A part of :class:`~celery_anarchon.stores.rabbitmq.store.RabbitMQStore` (its module
docstring explains the design), given what it needs of the store.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import amqp

from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores._common import retrying
from celery_anarchon.stores.base import HistoryRecord, RunEvent
from celery_anarchon.stores.rabbitmq.protocol import (
    ONE_MESSAGE, QueueNames, Session, decode, fold_history, history_arguments,
)

logger = logging.getLogger("celery_anarchon.stores.rabbitmq")

#: history events kept per run of history_size (a claim, a send, and skips of other instances)
HISTORY_EVENTS_PER_RUN = 4
#: how soon a reader refused an entry's lock tries again, seconds (then backing off up to
#: LOCK_POLL_MAX_S; the lock is held for one read of a history or memory start)
LOCK_POLL_S = 0.01
LOCK_POLL_MAX_S = 0.1


def local_ms() -> int:
    return int(time.time() * 1000)


class EntryQueues:
    """Lock, memory start and history of each entry, on the broker's queues: a part of
    :class:`~celery_anarchon.stores.rabbitmq.RabbitMQStore`, given what it needs of the store.

    :param using: ``using(doing)``: the store's session as a context manager (locked, errors
        translated, the session dropped on error).
    :param drop: ``drop()``: drop the store's session (its connection may be broken).
    :param warn_once: ``warn_once(message)``: log ``message`` once per store.
    """

    def __init__(self, *, names: QueueNames, namespace: str, instance_id: str, safe_url: str,
                 claim_timeout: float, history_size: int, using: Callable[[str], Any],
                 drop: Callable[[], None], warn_once: Callable[..., None]) -> None:
        self.names = names
        self.namespace = namespace
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.claim_timeout = claim_timeout
        self.history_size = history_size
        self._using = using
        self._drop = drop
        self._warn_once = warn_once

    # -- memory start (amnesia) -----------------------------------------------------------------
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
        confirms = s.confirms()
        tag = confirms.publish(self.names.born(entry), {
            "born_ms": int(born_ms), "instance": self.instance_id, "namespace": self.namespace,
            "entry": entry})
        confirms.wait(self.claim_timeout)
        if not confirms.acked(tag) or confirms.tainted:
            raise StoreUnavailable(f"RabbitMQ store {self.safe_url}: the memory start of entry "
                                   f"{entry!r} could not be written")

    # -- history (docs/design.md "Words": one record per run) -------------------------------------
    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Append the events in one pipeline and wait for their confirms.

        :raises StoreUnavailable: the broker could not be reached or did not confirm in time.
        """
        if notes:
            with self._using(f"recording {len(notes)} history event(s)") as s:
                self.publish_history(s, notes)

    def publish_history(self, s: Session, notes: Sequence[HistoryRecord]) -> None:
        """Publish ``notes`` to their entries' history queues and wait for the confirms. A queue
        that vanished (the broker forgot it) is declared again and its events published again."""
        now = local_ms()
        pending = [(n.entry, {"s": int(n.slot_ms), "e": RunEvent(n.event).value,
                              "i": self.instance_id, "t": now, "k": n.task_id,
                              "a": int(n.attempt), "d": n.detail}) for n in notes]
        for _ in range(2):
            if not pending:
                return
            for entry in dict.fromkeys(entry for entry, _ in pending):
                warning = self.ensure_history(s, entry)
                if warning:
                    self._warn_once(warning, logging.WARNING)
            confirms = s.confirms()
            tags = [(entry, body, confirms.publish(self.names.history(entry), body))
                    for entry, body in pending]
            confirms.wait(self.claim_timeout)
            gone = {entry for entry, _, _ in tags if self.names.history(entry) in confirms.returned}
            if confirms.tainted:
                s.retire_confirms()
            s.histories.difference_update(gone)
            pending = [(entry, body) for entry, body, _ in tags if entry in gone]
        if pending:
            raise StoreUnavailable(f"RabbitMQ store {self.safe_url}: the history queues of "
                                   f"{sorted({e for e, _ in pending})} vanished twice")

    def ensure_history(self, s: Session, entry: str) -> str | None:
        """Declare ``entry``'s history queue once per connection; one declared elsewhere with
        another bound is kept as it is (the warning is returned)."""
        if entry in s.histories:
            return None
        queue = self.names.history(entry)
        ch = s.channel()
        warning = None
        try:
            ch.queue_declare(queue, durable=True, auto_delete=False,
                             arguments=history_arguments(self.history_size * HISTORY_EVENTS_PER_RUN))
            ch.close()
        except amqp.exceptions.PreconditionFailed as exc:
            warning = (f"history queue {queue!r} exists with other arguments ("
                       f"{getattr(exc, 'reply_text', exc)}); it is kept as it is (instances use "
                       "different history_size values)")
        s.histories.add(entry)
        return warning

    def history(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first (at most ``limit`` or ``history_size``): every
        event is read unacked under the entry's lock and given back in place."""
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return []
        with self._using("reading history") as s:
            events = s.ensure(lambda: self.read_history(s, entry))
        return fold_history(entry, events, limit)

    def read_history(self, s: Session, entry: str) -> list[dict]:
        queue = self.names.history(entry)
        with self.entry_lock(s, entry):
            ch = s.channel()
            try:
                count = ch.queue_declare(queue, passive=True).message_count
            except amqp.exceptions.NotFound:
                return []
            messages: list = []
            if count:
                ch.basic_qos(0, 0, False)
                tag = ch.basic_consume(queue, no_ack=False, callback=messages.append)
                while len(messages) < count:
                    ch.connection.drain_events(timeout=self.claim_timeout)
                ch.basic_cancel(tag)
                for message in messages:
                    ch.basic_reject(message.delivery_tag, requeue=True)
            ch.close()  # synchronous: every message is back before the lock is released
        return [body for body in map(decode, messages) if body is not None]
