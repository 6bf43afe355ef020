"""How long the NATS store remembers, and since when: the stream's ``duplicate_window`` and the
epoch (docs/design.md "Amnesia").

**Memory.** A message id is remembered for ``duplicate_window`` after its first publish; after it
the run can be won again (hence the start-up rule jitter + max_late < duplicate_window). The
window is the stream's, recorded by the server, and it was last used when the stream last stored
a message (``state.last_ts``: claims and clock probes). An instance with another
``duplicate_window`` is refused at start-up (ConfigError naming both) while the stream was used
within the last ``duplicate_window + 2 x 10 s`` (this instance's value); after that, or on a
stream that never stored anything, the window is replaced (a warning). A window changed under a
running instance makes its claims ``FORGOTTEN`` (naming both values; nothing is published) until
the values agree again (:class:`Window`).

**Amnesia and partial loss.** The memory began when the claims stream was created (its
``created`` time, on the server's clock): a stream deleted and created again has forgotten every
message id, so a slot older than ``created + 10 s`` is FORGOTTEN. A server that crashed without
syncing keeps the stream but loses its newest claims, which a later claim would win again. The
**epoch** catches that (:class:`Epoch`): a one-message stream ``ANARCHON_EPOCH_<ns>`` kept in
*memory* (same replicas), whose message (the marker) is lost whenever the servers holding it
restart. Every claim reads the marker in the same pipeline as its publishes, after them, on one
connection (so on one server it describes the server process that took them, or a later one); a
missing marker is an epoch change: the claim writes a new one
(``Nats-Expected-Last-Subject-Sequence: 0``, the first writer wins) and the memory restarts at the
new marker's time: slots before it + 10 s are FORGOTTEN (a detail naming both epochs), for every
instance, since each one reads the same marker. Slots more than 10 s ahead of the server's clock
are refused EARLY, so no claim taken before the restart can be for a slot past that. What this
cannot see: a restart of one member of a cluster (the marker is copied from the others; an R3
stream lost nothing acknowledged); on a cluster the marker and the claims have different leaders,
so the check is not one step with the publishes there: R3 is the promise, the epoch covers the
whole cluster restarting. Every restart of a single server, clean or not, costs the runs of its
first 10 s (``forgotten``).
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores.nats.connection import (
    API, WRONG_LAST_SEQUENCE, ApiError, Names, Stored, logger, reply_json, stored_message, time_ms,
)
from celery_anarchon.stores.nats.streams import MAX_AGE_WINDOWS, Streams

_NS_PER_MS = 1_000_000


class Window:
    """The ``duplicate_window`` of this instance against the claims stream's (module docstring,
    "Memory"); ``conflict`` is the stream's other window, ms, while they differ.

    :param names: the store's streams. :param safe_url: the masked URL (for messages).
    :param duplicate_window_s: this instance's window, seconds.
    :param server_time: ``server_time(session, nc)``: the server's time, ms, from a write that
        is not to the claims stream (whose last write tells when it was last used); ``None``
        when it could not be read back.
    :param clock: this instance's wall clock, seconds (when the server's time is unknown).
    """

    def __init__(self, *, names: Names, safe_url: str, duplicate_window_s: float,
                 server_time: Callable[..., Awaitable[int | None]],
                 clock: Callable[[], float]) -> None:
        self.names = names
        self.safe_url = safe_url
        self.duplicate_window_s = duplicate_window_s
        self.window_ms = round(duplicate_window_s * 1000)
        self._server_time = server_time
        self._clock = clock
        self.conflict: int | None = None

    def text(self, live_ms: int) -> str:
        """Both values, for a ConfigError or a refusal's detail."""
        return (f"anarchon_store_options['duplicate_window'] is {self.duplicate_window_s:g} s "
                f"here, but stream {self.names.stream} remembers claims for {live_ms / 1000:g} s "
                "(the value the other instances use)")

    def check(self, info: dict) -> list[str]:
        """Note whether the live stream's window (``info``: its STREAM.INFO) is this instance's
        (docs/design.md "Amnesia"): a different one makes claims FORGOTTEN until they agree. Returns a
        warning for a stream kept in memory."""
        config = info["config"]
        live_ms = int(config.get("duplicate_window", 0)) // _NS_PER_MS
        warnings = []
        if config.get("storage") == "memory":
            warnings.append(f"NATS store {self.safe_url}: stream {self.names.stream} keeps its "
                            "claims in memory: a server restart forgets them (refused as 'store "
                            "forgot', never sent twice). Re-create it with file storage.")
        self.conflict = live_ms if live_ms != self.window_ms else None
        return warnings

    async def settle(self, session, nc, info: dict) -> tuple[dict, list[str]]:
        """At start-up: replace another live window when the stream was not used within this
        instance's window + 2 x 10 s (or never); the stream's info and a warning when replaced.

        :raises ConfigError: the other window was used within that time (naming both values and
            how to change it).
        """
        config = info["config"]
        live_ms = int(config.get("duplicate_window", 0)) // _NS_PER_MS
        if live_ms == self.window_ms:
            return info, []
        state = info.get("state") or {}
        used_ms = time_ms(state["last_ts"]) if int(state.get("messages") or 0) else None
        now_ms = await self._server_time(session, nc)
        if now_ms is None:
            now_ms = round(self._clock() * 1000)
        quiet_ms = self.window_ms + 2 * LATENESS_TOLERANCE_MS
        if used_ms is not None and now_ms - used_ms <= quiet_ms:
            raise ConfigError(
                f"NATS store {self.safe_url}: {self.text(live_ms)}, last used "
                f"{max(0, now_ms - used_ms) / 1000:.1f} s ago. Use the same duplicate_window on "
                "every instance; to change it, stop every instance using the old value and wait "
                f"{quiet_ms / 1000:g} s (the new duplicate_window + 20 s) before starting them "
                "with the new one.")
        config = dict(config, duplicate_window=self.window_ms * _NS_PER_MS,
                      max_age=MAX_AGE_WINDOWS * self.window_ms * _NS_PER_MS)
        updated = await session.api(nc, f"{API}.STREAM.UPDATE.{self.names.stream}", config)
        self.conflict = None
        return dict(info, config=updated.get("config", config)), [
            f"NATS store {self.safe_url}: stream {self.names.stream} had duplicate_window "
            f"{live_ms / 1000:g} s, unused for more than {quiet_ms / 1000:g} s; replaced by this "
            f"instance's {self.duplicate_window_s:g} s"]


class Epoch:
    """The epoch marker (module docstring, "Amnesia and partial loss"); ``marker`` is the one
    this instance saw last.

    :param streams: the store's streams (the epoch stream is created through it).
    :param instance_id: written into a new marker. :param safe_url: the masked URL (messages).
    """

    def __init__(self, *, streams: Streams, instance_id: str, safe_url: str) -> None:
        self.streams = streams
        self.names = streams.names
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.marker: Stored | None = None
        self._seen_before: int | None = None  # the marker's time before it last changed

    async def read(self, session, nc, seen, *, first: bool = False) -> Stored:
        """The epoch marker. ``seen``: the marker a claim just read (``None``: missing), or
        ``"read"`` to read it here. A missing marker is written again (the first writer wins);
        ``first`` marks the marker of a stream this instance just created (no change: the
        stream's creation already restarts the memory).

        :raises StoreUnavailable: the marker vanished as it was written.
        """
        subject = f"{API}.STREAM.MSG.GET.{self.names.epoch_stream}"
        query = json.dumps({"last_by_subj": self.names.epoch_subject}).encode()
        if seen == "read":
            await self._ensure(session, nc)
            [msg] = await session.pipeline(nc, [(subject, query, None)])
            seen = stored_message(msg, subject)
        if seen is None:
            await self._ensure(session, nc)
            body = {"change": not first, "i": self.instance_id,
                    "prev": self.marker.time_ms if self.marker is not None else None}
            [ack] = await session.pipeline(nc, [
                (self.names.epoch_subject, json.dumps(body).encode(),
                 {"Nats-Expected-Last-Subject-Sequence": "0"})])
            try:
                reply_json(ack, self.names.epoch_stream)
            except ApiError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:  # else another instance wrote it first
                    raise
            # read after the ack: on a cluster a pipelined read may overtake the publish
            [msg] = await session.pipeline(nc, [(subject, query, None)])
            seen = stored_message(msg, subject)
            if seen is None:
                raise StoreUnavailable(f"NATS store {self.safe_url}: the epoch marker in stream "
                                       f"{self.names.epoch_stream} vanished as it was written")
        self.note(seen)
        return seen

    async def _ensure(self, session, nc) -> None:
        await self.streams.ensure(session, nc, self.names.epoch_stream, self.streams.epoch_config())

    def note(self, marker: Stored) -> None:
        """Remember ``marker`` as the current one; a change is logged (a warning)."""
        old = self.marker
        changed = old is not None and (old.seq, old.time_ms) != (marker.seq, marker.time_ms)
        if changed:
            self._seen_before = old.time_ms
        self.marker = marker
        if changed:
            logger.warning("NATS store %s: %s", self.safe_url, self.detail(marker))

    def start(self) -> int | None:
        """The memory start of the current epoch, server ms; ``None`` when it is not a change."""
        marker = self.marker
        return marker.time_ms if marker is not None and marker.body.get("change") else None

    def detail(self, marker: Stored) -> str:
        """Why slots are refused after an epoch change, naming both epochs."""
        prev = marker.body.get("prev")
        if not isinstance(prev, int):
            prev = self._seen_before  # the writer had seen none; this instance had
        was = f"epoch {iso(int(prev))}" if isinstance(prev, int) else "an epoch unknown here"
        return (f"epoch changed ({was} -> epoch {iso(marker.time_ms)}): the epoch marker, kept "
                f"in memory in stream {self.names.epoch_stream}, was lost, so the servers "
                "holding it restarted and may have lost their newest claims; the store memory "
                f"restarted at {iso(marker.time_ms)}, slots before "
                f"{iso(marker.time_ms + LATENESS_TOLERANCE_MS)} are refused")
