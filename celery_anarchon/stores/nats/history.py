"""History and definitions of the NATS store, in its JetStream KV bucket.

The bucket ``ANARCHON_HISTORY_<namespace>`` (stream ``KV_ANARCHON_HISTORY_<namespace>``, one value
per key) holds ``h.<entry>.<slot>``, one record per run, and ``d.<entry>.<fingerprint>``, the
definitions. A skip event is a KV create (written only where the run has no record yet, docs/design.md
"One run, in time" step 9); other events are KV puts (they replace it). Every ``history_size / 4``
writes of an entry, a store purges the entry's keys down to the ``history_size`` last written (in
between, a few more are kept); :meth:`NATSHistory.history` reads every record of the entry through
an ephemeral consumer and returns the newest ``history_size`` by slot. A record's ``store_ms`` is
when the server stored it. Entry names and fingerprints are escaped by
:func:`~celery_anarchon.stores.nats.connection.token`.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

from celery_anarchon.stores.base import HistoryRecord, RunEvent, SKIP_EVENTS
from celery_anarchon.stores.parts import History
from celery_anarchon.stores.nats.connection import (
    API, NO_MESSAGE_FOUND, STREAM_NOT_FOUND, WRONG_LAST_SEQUENCE, ApiError, reply_json, status_of,
    token,
)
from celery_anarchon.stores.nats.streams import Streams

_NS = 1_000_000_000


class NATSHistory(History):
    """The history and definitions of :class:`~celery_anarchon.stores.nats.NATSStore`: a part
    given what it needs of the store; every method raises StoreUnavailable as the store's do.

    :param streams: the store's streams: the bucket is created through it, with its replicas,
        and noted in its ``ready`` set (re-checked when missing).
    :param call: ``call(doing, step, *args)``: run ``step(session, nc, *args)`` on the store's
        loop within ``claim_timeout`` (errors translated).
    """

    def __init__(self, *, streams: Streams, history_size: int, instance_id: str,
                 claim_timeout: float, call: Callable[..., Any]) -> None:
        self.streams = streams
        self.bucket = streams.names.bucket
        self.stream = streams.names.stream
        self.history_size = history_size
        self.instance_id = instance_id
        self.claim_timeout = claim_timeout
        self._call = call
        self._ready = streams.ready
        self._unpurged: dict[str, int] = {}  # entry -> history writes since this store trimmed it

    def _key(self, what: str, entry: str, last: str) -> str:
        return f"$KV.{self.bucket}.{what}.{token(entry)}.{last}"

    @property
    def kv_stream(self) -> str:
        return f"KV_{self.bucket}"

    async def ensure_bucket(self, session, nc) -> None:
        """Create the bucket (with the store's ``replicas``) unless this store knows it exists."""
        if self.kv_stream in self._ready:
            return
        if self.stream not in self._ready:
            self.streams.resolve_replicas(nc)
        await self.streams.ensure(session, nc, self.kv_stream, {
            "name": self.kv_stream, "subjects": [f"$KV.{self.bucket}.>"], "retention": "limits",
            "storage": "file", "discard": "new", "max_msgs_per_subject": 1, "max_msgs": -1,
            "max_bytes": -1, "max_msg_size": -1, "max_consumers": -1, "max_age": 0,
            "duplicate_window": 120 * _NS, "num_replicas": self.streams.replicas,
            "allow_rollup_hdrs": True, "deny_delete": True, "allow_direct": True})
        self._ready.add(self.kv_stream)

    async def kv(self, session, nc, requests: list[tuple]) -> list:
        """One round of KV requests; the bucket is created again if it was deleted."""
        await self.ensure_bucket(session, nc)
        replies = await session.pipeline(nc, requests)
        if any(status_of(msg) == "503" for msg in replies):
            self._ready.discard(self.kv_stream)
            await self.ensure_bucket(session, nc)
            replies = await session.pipeline(nc, requests)
        return replies

    async def write(self, session, nc, writes: list[tuple]) -> None:
        """Write ``(entry, slot, event, task_id, attempt, detail, fill_only)`` records in one
        round: a fill-only write is a KV create (``Nats-Expected-Last-Subject-Sequence: 0``),
        the others a KV put. Every ``history_size / 4`` writes of an entry, this store trims it
        to its newest ``history_size`` runs with a purge in the same round."""
        requests = []
        for entry, slot_ms, event, task_id, attempt, detail, fill_only in writes:
            value = {"e": RunEvent(event).value, "i": self.instance_id, "k": task_id,
                     "a": int(attempt), "d": detail}
            requests.append((self._key("h", entry, str(int(slot_ms))), json.dumps(value).encode(),
                             {"Nats-Expected-Last-Subject-Sequence": "0"} if fill_only else None))
        every = max(1, self.history_size // 4)
        for entry in dict.fromkeys(w[0] for w in writes):
            self._unpurged[entry] = self._unpurged.get(entry, 0) + sum(w[0] == entry for w in writes)
            if self._unpurged[entry] >= every:
                self._unpurged[entry] = 0
                requests.append((f"{API}.STREAM.PURGE.{self.kv_stream}", json.dumps(
                    {"filter": self._key("h", entry, ">"), "keep": self.history_size}).encode(), None))
        for msg in await self.kv(session, nc, requests):
            try:
                reply_json(msg, self.kv_stream)
            except ApiError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:  # else a fill-only write found a record
                    raise

    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        """Write one event of a run as this instance: a skip event only where the run has no
        record (KV create), others replace it (KV put). One round trip."""
        event = RunEvent(event)
        self._call("record", self.write,
                   [(entry, slot_ms, event, task_id, attempt, detail, event in SKIP_EVENTS)])

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        """Write several events in one round trip."""
        if notes:
            self._call("record", self.write,
                       [(n.entry, n.slot_ms, RunEvent(n.event), n.task_id, n.attempt, n.detail,
                         RunEvent(n.event) in SKIP_EVENTS) for n in notes])

    def read(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        """The entry's newest runs, newest first; ``store_ms`` is when the server stored the record."""
        limit = self.history_size if limit is None else int(limit)
        if limit < 1:
            return []
        records = self._call("read history", self._read_history, entry)
        records.sort(key=lambda h: h.slot_ms, reverse=True)
        return records[:limit]

    async def _read_history(self, session, nc, entry: str) -> list[HistoryRecord]:
        """Every run record of ``entry``: an ephemeral consumer delivering the last message of
        each key, fetched in one batch, then deleted."""
        await self.ensure_bucket(session, nc)
        stream = self.kv_stream
        try:
            created = await session.api(nc, f"{API}.CONSUMER.CREATE.{stream}", {
                "stream_name": stream, "config": {
                    "deliver_policy": "last_per_subject", "ack_policy": "none", "mem_storage": True,
                    "filter_subject": self._key("h", entry, ">"), "inactive_threshold": 30 * _NS}})
        except ApiError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
            self._ready.discard(stream)  # deleted: its history is gone
            await self.ensure_bucket(session, nc)
            return []
        name, pending = created["name"], int(created.get("num_pending", 0))
        records = []
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            if pending:
                await nc.publish(f"{API}.CONSUMER.MSG.NEXT.{stream}.{name}",
                                 json.dumps({"batch": pending, "no_wait": True}).encode(), reply=inbox)
            while len(records) < pending:
                msg = await sub.next_msg(timeout=self.claim_timeout)
                if msg.headers and msg.headers.get("Status"):
                    break
                value = json.loads(msg.data)
                records.append(HistoryRecord(
                    entry=entry, slot_ms=int(msg.subject.rsplit(".", 1)[1]), event=RunEvent(value["e"]),
                    instance=value["i"], store_ms=int(msg.metadata.timestamp.timestamp() * 1000),
                    task_id=value.get("k", ""), attempt=int(value.get("a", 1)), detail=value.get("d", "")))
        finally:
            await sub.unsubscribe()
            await session.pipeline(nc, [(f"{API}.CONSUMER.DELETE.{stream}.{name}", b"", None)])
        return records

    async def server_time(self, session, nc) -> int | None:
        """The server's time, UTC ms, from a write to this bucket (not the claims stream, whose
        last write tells when it was last used); ``None`` when it cannot be read back."""
        await self.ensure_bucket(session, nc)
        [ack] = await self.kv(session, nc, [(f"$KV.{self.bucket}.c.{token(self.instance_id)}",
                                             b"", None)])
        seq = reply_json(ack, self.kv_stream)["seq"]
        [stored] = await session.get(nc, self.kv_stream, [{"seq": seq}])
        return stored.time_ms if stored is not None else None

    # -- definitions --------------------------------------------------------------------------
    def save_definition(self, entry: str, fingerprint: str, text: str) -> None:
        """Remember ``text`` under (entry, fingerprint) in the history bucket (KV put)."""
        async def step(session, nc):
            key = self._key("d", entry, token(fingerprint))
            [ack] = await self.kv(session, nc, [(key, text.encode(), None)])
            reply_json(ack, self.kv_stream)
        self._call("save definition", step)

    def load_definition(self, entry: str, fingerprint: str) -> str | None:
        """The text saved for ``fingerprint``, ``None`` if unknown."""
        async def step(session, nc):
            subject = f"{API}.STREAM.MSG.GET.{self.kv_stream}"
            query = {"last_by_subj": self._key("d", entry, token(fingerprint))}
            [msg] = await self.kv(session, nc, [(subject, json.dumps(query).encode(), None)])
            try:
                data = reply_json(msg, subject)["message"].get("data") or ""
            except ApiError as exc:
                if exc.err_code == STREAM_NOT_FOUND:
                    self._ready.discard(self.kv_stream)
                if exc.err_code in (NO_MESSAGE_FOUND, STREAM_NOT_FOUND) or exc.code == 404:
                    return None
                raise
            return base64.b64decode(data).decode()
        return self._call("load definition", step)
