"""Instance records (heartbeats) of the NATS store: the
:class:`~celery_anarchon.stores.entry_store.Instances` part of
:class:`~celery_anarchon.stores.nats.NATSStore`.

**Records.** The stream ``ANARCHON_INSTANCES_<namespace>`` keeps one message per subject
``anarchon.instances.<namespace>.i.<instance>`` (``max_msgs_per_subject`` 1): each heartbeat
replaces the instance's last one. A record is live while its message's server timestamp plus the
``ttl_ms`` it was written with is later than the server's clock, so expiry is decided on the
server's clock, never on a reader's. The stream's ``max_age`` is the longest ttl written to it (it
is raised when an instance writes a longer one, never lowered), so the server deletes a dead
instance's record itself once every ttl has passed. A reader learns the server's clock from a
probe message it stores on ``...clock.<instance>`` of the same stream just before reading (one
round trip with the read); records are read through an ephemeral consumer delivering the last
message of each subject. Leaving purges the instance's subject.

**Fingerprint mappings** (digest -> {config entry: fingerprint}) are in the stream
``ANARCHON_FINGERPRINTS_<namespace>``, one message per digest, zlib-compressed JSON (NATS refuses
a message over the server's ``max_payload``, 1 MB by default: about 30,000 config entries),
``max_age`` one day; an instance whose heartbeat names a mapping it saved saves it again every
12 hours, so a mapping lives as long as a live record names it.

Both streams are created on first use with the store's ``replicas`` and file storage. Names are
escaped by :func:`~celery_anarchon.stores.nats.connection.token`.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from celery_anarchon.stores.entry_store import Instances, InstanceRecord
from celery_anarchon.stores.nats.connection import (
    API, NO_MESSAGE_FOUND, STREAM_NOT_FOUND, ApiError, Missing, reply_json, token,
)
from celery_anarchon.stores.nats.streams import Streams

_NS_PER_MS = 1_000_000
#: a fingerprint mapping is kept this long after its last save, ms
FINGERPRINTS_MAX_AGE_MS = 24 * 3600 * 1000
#: an instance saves the mapping its heartbeat names again after this long, seconds
FINGERPRINTS_REFRESH_S = 12 * 3600.0
#: the fields of a record its heartbeat writes (``seen_ms`` and ``expires_ms`` are read back;
#: ``kept`` is about store entries, which a NATS store does not hold; ``refused`` is optional: a
#: record of an older version has none)
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(InstanceRecord)
                       if f.name not in ("seen_ms", "expires_ms", "kept", "refused"))


#: the instances stream's max_age when it is created, ms: nats-server refuses one under 100 ms
#: (err_code 10052), and a reader creates the stream with no ttl of its own. A longer max_age only
#: keeps messages longer: a record is live by its own ttl.
MIN_MAX_AGE_MS = 60_000


class NATSInstances(Instances):
    """The instance records of one NATS store (module docstring); every method raises
    :class:`~celery_anarchon.errors.StoreUnavailable` as the store's do.

    :param streams: the store's streams (names, replicas, the ``ready`` set).
    :param instance_id: this instance's id (its clock probe subject).
    :param claim_timeout: seconds a read may wait for the records it was promised.
    :param call: ``call(doing, step, *args)``: run ``step(session, nc, *args)`` on the store's
        loop within ``claim_timeout`` (errors translated).
    :param monotonic: elapsed-time clock, seconds (when a mapping was last saved).
    """

    def __init__(self, *, streams: Streams, instance_id: str, claim_timeout: float,
                 call: Callable[..., Any], monotonic: Callable[[], float] = time.monotonic) -> None:
        names = streams.names
        self.streams = streams
        self.stream = names.instances_stream
        self.root = names.instances_root
        self.fp_stream = names.fingerprints_stream
        self.fp_root = names.fingerprints_root
        self.instance_id = instance_id
        self.claim_timeout = claim_timeout
        self._call = call
        self._monotonic = monotonic
        self._max_age_ms = 0                 # the instances stream's max_age, as last seen
        self._saved: dict[str, tuple[bytes, float]] = {}  # digest -> (payload, saved at)

    def _subject(self, instance_id: str) -> str:
        return f"{self.root}.i.{token(instance_id)}"

    # -- the streams --------------------------------------------------------------------------
    def _config(self, name: str, subjects: str, max_age_ms: int) -> dict:
        return {"name": name, "subjects": [subjects], "retention": "limits", "storage": "file",
                "discard": "old", "max_msgs_per_subject": 1, "max_msgs": -1, "max_bytes": -1,
                "max_msg_size": -1, "max_consumers": -1, "num_replicas": self.streams.replicas,
                "max_age": int(max_age_ms) * _NS_PER_MS, "duplicate_window": 0}

    async def _ensure(self, session, nc, name: str, config: dict) -> dict | None:
        """Create the stream unless this store knows it exists; its info when it looked."""
        if name in self.streams.ready:
            return None
        if self.streams.names.stream not in self.streams.ready:
            self.streams.resolve_replicas(nc)
            config = dict(config, num_replicas=self.streams.replicas)
        info = await self.streams.ensure(session, nc, name, config)
        self.streams.ready.add(name)
        return info

    async def _instances_stream(self, session, nc, ttl_ms: int = 0) -> None:
        """The instances stream exists and keeps records at least ``ttl_ms``: created with that
        max_age, or raised to it (never lowered)."""
        info = await self._ensure(session, nc, self.stream,
                                  self._config(self.stream, f"{self.root}.>",
                                               max(ttl_ms, MIN_MAX_AGE_MS)))
        if info is not None:
            self._max_age_ms = int(info["config"].get("max_age") or 0) // _NS_PER_MS
        if ttl_ms > self._max_age_ms:
            info = await session.api(nc, f"{API}.STREAM.INFO.{self.stream}")
            config = info["config"]
            live = int(config.get("max_age") or 0) // _NS_PER_MS
            if ttl_ms > live:
                await session.api(nc, f"{API}.STREAM.UPDATE.{self.stream}",
                                  dict(config, max_age=int(ttl_ms) * _NS_PER_MS))
                live = ttl_ms
            self._max_age_ms = live

    async def _publish(self, session, nc, stream: str, ensure, subject: str, payload: bytes) -> int:
        """Publish and check the ack (the stream created again if it vanished); its sequence."""
        await ensure()
        [ack] = await session.pipeline(nc, [(subject, payload, None)])
        try:
            return int(reply_json(ack, subject)["seq"])
        except Missing:                      # deleted under us: create it again, once
            self.streams.ready.discard(stream)
            await ensure()
            [ack] = await session.pipeline(nc, [(subject, payload, None)])
            return int(reply_json(ack, subject)["seq"])

    # -- Instances --------------------------------------------------------------------------
    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        """Replace this instance's record; it expires ``ttl_ms`` after the server stored it, on
        the server's clock. Saves the mapping it names again when due (module docstring)."""
        ttl_ms = max(1, int(ttl_ms))
        body = dict({f: getattr(record, f) for f in _RECORD_FIELDS}, ttl_ms=ttl_ms,
                    refused=record.refused)
        payload = json.dumps(body, sort_keys=True).encode()
        refresh = self._saved.get(record.fingerprints_digest)

        async def step(session, nc):
            await self._publish(session, nc, self.stream,
                                lambda: self._instances_stream(session, nc, ttl_ms),
                                self._subject(record.instance_id), payload)
            if refresh is not None and self._monotonic() - refresh[1] > FINGERPRINTS_REFRESH_S:
                await self._save(session, nc, record.fingerprints_digest, refresh[0])
        self._call("record the instance", step)

    def instances(self) -> list[InstanceRecord]:
        """The records live on the server's clock, by instance id (module docstring)."""
        return self._call("read the instances", self._read)

    async def _read(self, session, nc) -> list[InstanceRecord]:
        await self._instances_stream(session, nc)
        probe = f"{self.root}.clock.{token(self.instance_id)}"
        await self._publish(session, nc, self.stream, lambda: self._instances_stream(session, nc),
                            probe, b"")
        messages = await self._last_per_subject(session, nc, f"{self.root}.>")
        now_ms = max((ts for _, ts, _ in messages), default=0)
        out = []
        for subject, seen_ms, data in messages:
            if not subject.startswith(f"{self.root}.i."):
                continue
            try:
                body = json.loads(data)
                ttl = int(body["ttl_ms"])
                fields = {f: body[f] for f in _RECORD_FIELDS}
            except (ValueError, KeyError, TypeError):
                continue                     # not a record of this version: ignored
            if seen_ms + ttl > now_ms:
                out.append(InstanceRecord(**fields, seen_ms=seen_ms, expires_ms=seen_ms + ttl,
                                          refused=body.get("refused")))
        return sorted(out, key=lambda r: r.instance_id)

    async def _last_per_subject(self, session, nc, subjects: str) -> list[tuple[str, int, bytes]]:
        """(subject, server time ms, data) of the last message of each subject: an ephemeral
        consumer, fetched in one batch, then deleted."""
        created = await session.api(nc, f"{API}.CONSUMER.CREATE.{self.stream}", {
            "stream_name": self.stream, "config": {
                "deliver_policy": "last_per_subject", "ack_policy": "none", "mem_storage": True,
                "filter_subject": subjects, "inactive_threshold": 30_000 * _NS_PER_MS}})
        name, pending = created["name"], int(created.get("num_pending", 0))
        out: list[tuple[str, int, bytes]] = []
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        try:
            if pending:
                await nc.publish(f"{API}.CONSUMER.MSG.NEXT.{self.stream}.{name}",
                                 json.dumps({"batch": pending, "no_wait": True}).encode(), reply=inbox)
            while len(out) < pending:
                msg = await sub.next_msg(timeout=self.claim_timeout)
                if msg.headers and msg.headers.get("Status"):
                    break
                out.append((msg.subject, int(msg.metadata.timestamp.timestamp() * 1000), msg.data))
        finally:
            await sub.unsubscribe()
            await session.pipeline(nc, [(f"{API}.CONSUMER.DELETE.{self.stream}.{name}", b"", None)])
        return out

    def remove_instance(self, instance_id: str) -> None:
        """Purge the instance's record (nothing to do when there is none)."""
        async def step(session, nc):
            try:
                await session.api(nc, f"{API}.STREAM.PURGE.{self.stream}",
                                  {"filter": self._subject(instance_id)})
            except ApiError as exc:
                if exc.err_code != STREAM_NOT_FOUND:
                    raise
                self.streams.ready.discard(self.stream)
        self._call("remove the instance", step)

    def save_fingerprints(self, digest: str, fingerprints: Mapping[str, str]) -> None:
        """Keep the mapping under ``digest`` for a day (again every 12 h while this instance's
        heartbeat names it)."""
        payload = zlib.compress(json.dumps(dict(fingerprints), sort_keys=True).encode())

        async def step(session, nc):
            await self._save(session, nc, digest, payload)
        self._call("save fingerprints", step)

    async def _save(self, session, nc, digest: str, payload: bytes) -> None:
        async def ensure():
            await self._ensure(session, nc, self.fp_stream, self._config(
                self.fp_stream, f"{self.fp_root}.>", FINGERPRINTS_MAX_AGE_MS))
        await self._publish(session, nc, self.fp_stream, ensure, f"{self.fp_root}.{token(digest)}", payload)
        self._saved[digest] = (payload, self._monotonic())

    def load_fingerprints(self, digest: str) -> dict[str, str] | None:
        """The mapping saved under ``digest``, ``None`` if unknown (or older than a day)."""
        async def step(session, nc):
            subject = f"{API}.STREAM.MSG.GET.{self.fp_stream}"
            query = {"last_by_subj": f"{self.fp_root}.{token(digest)}"}
            [msg] = await session.pipeline(nc, [(subject, json.dumps(query).encode(), None)])
            try:
                data = reply_json(msg, subject)["message"].get("data") or ""
            except Missing:
                return None
            except ApiError as exc:
                if exc.err_code in (NO_MESSAGE_FOUND, STREAM_NOT_FOUND) or exc.code == 404:
                    return None
                raise
            return json.loads(zlib.decompress(base64.b64decode(data)))
        return self._call("load fingerprints", step)
