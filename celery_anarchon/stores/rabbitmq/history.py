"""History of the RabbitMQ store: one durable queue per entry that writers append events to and
readers fold (docs/design.md "Words": one record per run). A part of
:class:`~celery_anarchon.stores.rabbitmq.store.RabbitMQStore` (its module docstring explains the
design: "History"), given what it needs of the store.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import amqp

from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores.base import SKIP_EVENTS, HistoryRecord, RunEvent
from celery_anarchon.stores.parts import History
from celery_anarchon.stores.rabbitmq.connection import (
    QueueNames, Session, decode, history_arguments,
)
from celery_anarchon.stores.rabbitmq.memory import MemoryStarts, local_ms

#: history events kept per run of history_size (a claim, a send, and skips of other instances)
HISTORY_EVENTS_PER_RUN = 4


class RabbitMQHistory(History):
    """The ``history`` part of the RabbitMQ store: the history queue of each entry, read under
    the entry's lock (:mod:`.memory`). It keeps no definitions (:meth:`save_definition`).

    :param using: ``using(doing)``: the store's session as a context manager (locked, errors
        translated, the session dropped on error).
    :param memory: the memory starts, whose entry locks the readers hold.
    :param warn_once: ``warn_once(message, level)``: log ``message`` once per store.
    """

    def __init__(self, *, names: QueueNames, instance_id: str, safe_url: str,
                 claim_timeout: float, history_size: int, using: Callable[[str], Any],
                 memory: MemoryStarts, warn_once: Callable[..., None]) -> None:
        self.names = names
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.claim_timeout = claim_timeout
        self.history_size = history_size
        self._using = using
        self._memory = memory
        self._warn_once = warn_once

    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Append one event of a run to ``entry``'s history (skip events only fill)."""
        self.record_many([HistoryRecord(entry, slot_ms, RunEvent(event), task_id=task_id,
                                        attempt=attempt, detail=detail)])

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

    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first (at most ``limit`` or ``history_size``): every
        event is read unacked under the entry's lock and given back in place."""
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return []
        with self._using("reading history") as s:
            events = s.ensure(lambda: self.read_history(s, entry))
        return fold_history(entry, events, limit)

    # -- definitions --------------------------------------------------------------------------
    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Keeps nothing: a queue holds messages, not a lookup by key, so the texts behind
        fingerprints are not kept on RabbitMQ (:meth:`load_definition` knows none; status names
        a differing definition by its fingerprint only)."""

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """``None``: no definition is kept (:meth:`save_definition`)."""
        return None

    def read_history(self, s: Session, entry: str) -> list[dict]:
        queue = self.names.history(entry)
        with self._memory.entry_lock(s, entry):
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


def fold_history(entry: str, events: Iterable[dict], limit: int) -> list[HistoryRecord]:
    """The newest ``limit`` runs of ``entry``, newest first, from its events in the order they
    were stored: one record per run, a later event replaces an earlier one, and a skip event only
    fills a run that has no record yet (:meth:`~celery_anarchon.stores.parts.History.record`).
    Malformed events are ignored."""
    runs: dict[int, tuple[dict, RunEvent]] = {}
    for raw in events:
        try:
            slot, event = int(raw["s"]), RunEvent(raw["e"])
        except (KeyError, TypeError, ValueError):
            continue
        if event in SKIP_EVENTS and slot in runs:
            continue
        runs[slot] = (raw, event)
    records = []
    for slot in sorted(runs, reverse=True)[:max(0, limit)]:
        raw, event = runs[slot]
        records.append(HistoryRecord(
            entry=entry, slot_ms=slot, event=event, instance=str(raw.get("i", "")),
            store_ms=_int(raw.get("t")), task_id=str(raw.get("k", "")), attempt=_int(raw.get("a"), 1),
            detail=str(raw.get("d", ""))))
    return records


def _int(value, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
