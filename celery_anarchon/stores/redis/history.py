"""History and definitions of the Redis store, every strategy: a part of
:class:`~celery_anarchon.stores.redis.store.RedisStore`, given its connection and the keys of an
entry. The records are written and read by the scripts every strategy shares (:mod:`.scripts`);
instants are UTC ms on the server's clock.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

from celery_anarchon.stores.base import SKIP_EVENTS, HistoryRecord, RunEvent
from celery_anarchon.stores.parts import History
from celery_anarchon.stores.redis.connection import RedisConnection

#: ``read_many`` sends at most this many history reads in one pipeline (one round trip each)
HISTORY_BATCH = 500
#: definitions saved per pipelined round trip (:meth:`RedisHistory.save_definitions`)
DEFINITIONS_PER_TRIP = 1000


def _items(value) -> list:
    """A JSON array from cjson, which encodes an empty Lua table as ``{}``."""
    return value if isinstance(value, list) else []


def _record(entry: str, slot_ms: int, r: dict) -> HistoryRecord:
    """One history record ``{e, i, t, k, a, d, c?}`` of a script's reply."""
    return HistoryRecord(entry=entry, slot_ms=slot_ms, event=RunEvent(r["e"]), instance=r["i"],
                         store_ms=int(r["t"]), task_id=r["k"], attempt=int(r["a"]), detail=r["d"],
                         earlier=tuple(_record(entry, slot_ms, e) for e in _items(r.get("c"))))


def history_records(entry: str, reply: dict) -> list[HistoryRecord]:
    """The records of the history script's ``reply`` ``{now, records: [{s, r}]}``, newest
    first (each with the earlier attempts' records it keeps)."""
    return [_record(entry, int(h["s"]), h["r"]) for h in _items(reply.get("records"))]


class RedisHistory(History):
    """The ``history`` part of a Redis store: ``record``, ``record_many``, ``read``,
    ``read_many`` and the definitions.

    :param connection: the store's connection.
    :param history_size: runs of history kept per entry.
    :param block: ``block(entry)``: the keys every shared script takes for ``entry``
        (:data:`.scripts.ENTRY_KEYS` order).
    :param definitions_key: ``definitions_key(entry)``: the hash of ``entry``'s definitions.
    """

    def __init__(self, connection: RedisConnection, *, history_size: int,
                 block: Callable[[str], list[str]], definitions_key: Callable[[str], str]) -> None:
        self.connection = connection
        self.history_size = history_size
        self._block = block
        self._definitions_key = definitions_key

    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Write one history event as this instance, store_ms on the server's clock; skip events
        only fill an empty record (a skip is recorded once, never over a claim).

        :raises StoreUnavailable: the server did not answer.
        """
        event = RunEvent(event)
        self.connection.call("record", self._block(entry), int(slot_ms), event.value, task_id, int(attempt),
                   detail, "1" if event in SKIP_EVENTS else "0")

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Several :meth:`record` events in one pipelined round trip.

        :raises StoreUnavailable: the server did not answer.
        """
        if not notes:
            return
        client, scripts = self.connection.client()
        with self.connection.unavailable("record"):
            pipe = client.pipeline(transaction=False)
            for n in notes:
                event = RunEvent(n.event)
                scripts["record"](
                    keys=[*self.connection.head_keys, *self._block(n.entry)],
                    args=[*self.connection.header(), int(n.slot_ms), event.value, n.task_id, int(n.attempt),
                          n.detail, "1" if event in SKIP_EVENTS else "0"], client=pipe)
            pipe.execute()

    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first (one script: index and records read together).

        :raises StoreUnavailable: the server did not answer.
        """
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return []
        return history_records(entry, self.connection.call("history", self._block(entry), limit))

    def read_many(self, entries: Iterable[str],
                  limit: int | None = None) -> dict[str, list[HistoryRecord]]:
        """:meth:`read` of each of ``entries``: the same script per entry, pipelined
        (:data:`HISTORY_BATCH` a round trip).

        :returns: ``{entry: runs newest first}`` for every name given.
        :raises StoreUnavailable: the server did not answer (nothing is returned).
        """
        names = list(dict.fromkeys(entries))
        limit = self.history_size if limit is None else int(limit)
        if limit < 1 or not names:
            return {name: [] for name in names}
        client, scripts = self.connection.client()
        out: dict[str, list[HistoryRecord]] = {}
        for start in range(0, len(names), HISTORY_BATCH):
            chunk = names[start:start + HISTORY_BATCH]
            with self.connection.unavailable("history"):
                pipe = client.pipeline(transaction=False)
                for name in chunk:
                    scripts["history"](keys=[*self.connection.head_keys, *self._block(name)],
                                       args=[*self.connection.header(), limit], client=pipe)
                replies = pipe.execute()
            out.update((name, history_records(name, json.loads(reply)))
                       for name, reply in zip(chunk, replies))
        return out

    # -- definitions --------------------------------------------------------------------------
    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember the text of ``fingerprint``. :raises StoreUnavailable:"""
        with self.connection.unavailable("save definition"):
            self.connection.client()[0].hset(self._definitions_key(entry), fingerprint, text)

    def save_definitions(self, definitions: Iterable[tuple[str, str, str]]) -> None:
        """Every ``(entry, fingerprint, text)`` with one HSET each, pipelined in round trips of
        :data:`DEFINITIONS_PER_TRIP`. :raises StoreUnavailable:"""
        client = self.connection.client()[0]
        items = list(definitions)
        with self.connection.unavailable("save definitions"):
            for start in range(0, len(items), DEFINITIONS_PER_TRIP):
                pipe = client.pipeline(transaction=False)
                for entry, fingerprint, text in items[start:start + DEFINITIONS_PER_TRIP]:
                    pipe.hset(self._definitions_key(entry), fingerprint, text)
                pipe.execute()

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, or ``None``. :raises StoreUnavailable:"""
        with self.connection.unavailable("load definition"):
            text = self.connection.client()[0].hget(self._definitions_key(entry), fingerprint)
        return text.decode() if isinstance(text, bytes) else text
