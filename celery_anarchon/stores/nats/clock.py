"""The NATS server's clock and this instance's skew to it.

**Clock skew.** The server's clock decides no lateness here (``checks_lateness`` is False), so the
instances' clocks must agree: a run's window opens at its first claim and must still be open at its
last, up to max_late after the slot on the slowest clock. The server's time is the timestamp of a
stored message: the store publishes to its own ``...clock.<instance>`` subject, reads the message
back and measures this instance's offset (:class:`celery_anarchon._util.Skew`, the computation the
engine's skew check uses too; again with a claim when older than 1 s; first when older than 60 s
or when the local clock jumped). A claim is refused before it is published when
``|offset| + uncertainty > (duplicate_window - max_late) / 2``: with every instance within that
bound, a run's first and last claim are at most max_late + 2 x bound = duplicate_window apart on
the server's clock. The refusal answers EARLY when this clock is ahead, LATE when it is behind,
with the offset and the bound in its detail; a slot older than the window on the server's clock is
FORGOTTEN. A refused instance publishes nothing, so it cannot block the run for the others, but it
reads whether the run was claimed (already claimed comes first). The refusals:
:meth:`.claims.Claims.refusal`.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from celery_anarchon._util import Skew
from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores._common import retrying
from celery_anarchon.stores.nats.connection import Missing, Names, Stored, reply_json

#: the skew is measured again with a claim when older than this, seconds
SKEW_REFRESH_S = 1.0
#: ...and before a claim when older than this, or when the local clock jumped more than
#: CLOCK_JUMP_S against the monotonic clock since, seconds
SKEW_MAX_AGE_S = 60.0
CLOCK_JUMP_S = 0.5
#: tries of one clock probe (a stream between leaders answers nothing for a moment)
PROBE_ATTEMPTS = 3


class _Vanished(StoreUnavailable):
    """The clock message was gone when read back (replaced by a concurrent probe)."""


class ServerClock:
    """Reads the server's clock and keeps this instance's skew to it (module docstring): a part
    of :class:`~celery_anarchon.stores.nats.NATSStore`.

    :param names: the store's streams and this instance's clock subject.
    :param safe_url: the masked URL (for messages).
    :param clock: this instance's wall clock, epoch seconds (the clock measured).
    :param claims_stream: ``claims_stream(session, nc)``: check (or create) the claims stream,
        before a probe is tried again after no answer.

    ``skew`` is the last measurement (``None`` before the first), taken at ``wall_s`` on
    ``clock`` and ``mono_s`` on the monotonic clock.
    """

    def __init__(self, *, names: Names, safe_url: str, clock: Callable[[], float],
                 claims_stream: Callable[..., Awaitable[object]]) -> None:
        self.names = names
        self.safe_url = safe_url
        self.clock = clock
        self._claims_stream = claims_stream
        self.skew: Skew | None = None
        self.wall_s = 0.0
        self.mono_s = 0.0

    async def probe(self, session, nc) -> int:
        """Store a message on this instance's clock subject and read its server time back: the
        server's time, UTC ms (the skew measured on the way). Tried ``PROBE_ATTEMPTS`` times
        (:func:`~celery_anarchon.stores._common.retrying`): after no answer (the claims stream
        checked again first) or a clock message already replaced.

        :raises Missing: the claims stream never answered. :raises StoreUnavailable: the clock
            message vanished every time.
        """
        missing = False
        async for attempt in retrying((Missing, _Vanished), attempts=PROBE_ATTEMPTS, wait_s=0.1,
                                      max_wait_s=0.3, asynchronous=True):
            with attempt:
                if missing:  # a stream between leaders answers nothing: is it there?
                    await self._claims_stream(session, nc)
                t0 = self.clock()
                [ack] = await session.pipeline(nc, [(self.names.clock_subject, b"", None)])
                t1 = self.clock()
                try:
                    seq = reply_json(ack, self.names.stream)["seq"]
                except Missing:
                    missing = True
                    raise
                missing = False
                [stored] = await session.get(nc, self.names.stream, [{"seq": seq}])
                if stored is None:  # replaced by a concurrent probe of this instance
                    raise _Vanished(f"NATS store {self.safe_url}: the clock message vanished")
                return self.measured(stored, t0, t1)

    def measured(self, stored: Stored, t0: float, t1: float) -> int:
        """Record the skew from a clock message stored between local times t0 and t1 (s);
        returns its server time, UTC ms."""
        self.skew = Skew.measured(t0, t1, stored.time_ms)
        self.wall_s, self.mono_s = self.clock(), time.monotonic()
        return stored.time_ms

    async def fresh(self, session, nc) -> bool:
        """Measure the skew first if unknown, stale or the local clock jumped; True when the
        claim should measure it again on the way (older than SKEW_REFRESH_S)."""
        mono = time.monotonic()
        if self.skew is None or mono - self.mono_s > SKEW_MAX_AGE_S \
                or abs((self.clock() - self.wall_s) - (mono - self.mono_s)) > CLOCK_JUMP_S:
            await self.probe(session, nc)
            return False
        return mono - self.mono_s > SKEW_REFRESH_S
