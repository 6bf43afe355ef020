"""The claims of the NATS store: the first publish of a run's message id wins.

**The claim.** Each namespace has a claims stream ``ANARCHON_CLAIMS_<ns>`` over
``anarchon.claims.<ns>.>``, created with ``duplicate_window`` = the store option (default 300 s:
the memory) and ``max_age`` = twice that. A claim publishes a JSON body (instance id, fingerprint,
task id, entry, slot, max_late) to the run's own subject ``anarchon.claims.<ns>.run.<entry>.<slot>``
with ``Nats-Msg-Id: <entry>.<slot>``. JetStream stores the first publish of a message id and
answers every later one within the window ``duplicate: true`` with the original's sequence: the
server decides, the first publish wins. The stored body names the winner, so a duplicate reads it
back by sequence: the winner's own retry answers WON, others OTHER_WON with the winner and its
fingerprint (docs/design.md "Who won"). Rounds per batch, each pipelined on one connection: 1. the
publishes, then the stream's info and the epoch marker (:mod:`.memory`, "Amnesia and partial
loss"); 2. reading back the winners of duplicates (with the clock probe and a young stream's memory
start when due); 3. the history writes. Won: rounds 1 and 3; lost: 1, 2.

Before publishing, a claim may be refused (:meth:`Claims.refusal`): another live
duplicate_window (:mod:`.memory`, "Memory"), this instance's clock too far from the server's
(:mod:`.clock`), a slot too far ahead or older than the window on the server's clock.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.stores.base import ClaimRequest, ClaimResult, Outcome, RunEvent
from celery_anarchon.stores.nats.clock import ServerClock
from celery_anarchon.stores.nats.connection import (
    API, Stored, logger, reply_json, stored_message, token,
)
from celery_anarchon.stores.nats.history import NATSHistory
from celery_anarchon.stores.nats.memory import Epoch, Window
from celery_anarchon.stores.nats.streams import Streams

#: a refusal decided before publishing: (outcome, detail)
Refusal = tuple[Outcome, str]


class Claims:
    """Decides a batch of claims (module docstring): a part of
    :class:`~celery_anarchon.stores.nats.NATSStore`, given the parts it reads.

    :param instance_id: this instance, written into its claims.
    :param safe_url: the masked URL (for messages).
    :param streams: the store's streams (their names, the claims stream's creation time).
    :param window: this instance's duplicate_window against the stream's.
    :param epoch: the epoch marker. :param server_clock: the skew to the server's clock.
    :param history: where won runs and skips are recorded.
    :param warn: ``warn(warnings)``: log each new warning once.

    ``born`` caches each entry's memory start per stream: ``(stream created, entry) -> born``,
    server ms.
    """

    def __init__(self, *, instance_id: str, safe_url: str, streams: Streams, window: Window,
                 epoch: Epoch, server_clock: ServerClock, history: NATSHistory,
                 warn: Callable[[list[str]], None]) -> None:
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.streams = streams
        self.names = streams.names
        self.window = window
        self.epoch = epoch
        self.server_clock = server_clock
        self.history = history
        self._warn = warn
        self.born: dict[tuple[int, str], int] = {}

    def refusal(self, r: ClaimRequest, local_ms: float) -> Refusal | None:
        """Refuse before publishing: another live duplicate_window, this instance's clock too far
        from the server's, a slot more than 10 s ahead of the server's clock, or one older than
        the window on the server's clock (:mod:`.clock`, :mod:`.memory`)."""
        window_ms = self.window.window_ms
        if self.window.conflict is not None:
            return (Outcome.FORGOTTEN, self.window.text(self.window.conflict)
                    + ": not claimed (a possible miss); use one duplicate_window on every instance")
        skew = self.server_clock.skew
        bound = (window_ms - r.max_late_ms) / 2
        off = skew.offset_ms
        if abs(off) + skew.uncertainty_ms > bound:
            return (Outcome.EARLY if off > 0 else Outcome.LATE,
                    f"this instance's clock is {abs(off) / 1000:.3f} s "
                    f"{'ahead of' if off > 0 else 'behind'} the NATS server's (+/- "
                    f"{skew.uncertainty_ms / 1000:.3f} s), more than the {max(bound, 0) / 1000:g} s "
                    f"allowed = (duplicate_window {window_ms / 1000:g} s - max_late "
                    f"{r.max_late_ms / 1000:g} s) / 2: a claim this far off could come after the "
                    "window closed. Run NTP on every host.")
        server_ms = local_ms - off
        if r.slot_ms - server_ms > LATENESS_TOLERANCE_MS - skew.uncertainty_ms:
            return (Outcome.EARLY, f"the slot is {(r.slot_ms - server_ms) / 1000:.3f} s ahead of "
                                   "the NATS server's clock (more than the 10 s allowed: a claim "
                                   "taken before a server restart must be for a slot the epoch "
                                   "change refuses)")
        if server_ms - r.slot_ms >= window_ms:
            return (Outcome.FORGOTTEN, f"the slot is older than the stream's duplicate_window "
                                       f"({window_ms / 1000:g} s) on the server's clock")
        return None

    async def claim(self, session, nc, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch in three pipelined rounds (module docstring).

        :raises Missing: the claims stream was deleted (the caller creates it again and retries).
        """
        names, clock = self.names, self.server_clock
        reprobe = await clock.fresh(session, nc)
        local_ms = clock.clock() * 1000
        refusals = [self.refusal(r, local_ms) for r in requests]
        get = f"{API}.STREAM.MSG.GET.{names.stream}"
        # round 1: publish every claim (a refused one only looks up its run), then the stream info
        round1 = []
        for r, refusal in zip(requests, refusals):
            subject = names.run_subject(r.entry, r.slot_ms)
            if refusal is None:
                body = {"i": self.instance_id, "f": r.fingerprint, "k": r.task_id, "e": r.entry,
                        "s": int(r.slot_ms), "l": int(r.max_late_ms)}
                round1.append((subject, json.dumps(body).encode(),
                               {"Nats-Msg-Id": f"{token(r.entry)}.{int(r.slot_ms)}"}))
            else:
                round1.append((get, json.dumps({"last_by_subj": subject}).encode(), None))
        if reprobe:
            round1.append((names.clock_subject, b"", None))
        round1.append((f"{API}.STREAM.INFO.{names.stream}", b"", None))
        epoch_get = f"{API}.STREAM.MSG.GET.{names.epoch_stream}"
        round1.append((epoch_get, json.dumps({"last_by_subj": names.epoch_subject}).encode(), None))
        t0 = clock.clock()
        replies = await session.pipeline(nc, round1)
        t1 = clock.clock()
        info = reply_json(replies[-2], names.stream)   # Missing when the stream was deleted
        created = self.streams.note_created(info)
        window_before = self.window.conflict
        self._warn(self.window.check(info))
        # the epoch, read after the publishes on this connection (:mod:`.memory`)
        marker = stored_message(replies[-1], epoch_get)
        if marker is None:
            await self.epoch.read(session, nc, None)
        else:
            self.epoch.note(marker)
        epoch_ms = self.epoch.start()
        window_changed = window_before is None and self.window.conflict is not None
        if window_changed:
            logger.error("NATS store %s: %s; claims are refused as 'forgotten' until every "
                         "instance uses one duplicate_window", self.safe_url,
                         self.window.text(self.window.conflict))
        # round 2: who won the duplicates, the clock, the memory start of a young stream
        found: dict[int, Stored | None] = {}
        queries, owners = [], []
        for i, (r, refusal) in enumerate(zip(requests, refusals)):
            if refusal is not None:
                found[i] = stored_message(replies[i], get)
                continue
            ack = reply_json(replies[i], names.stream)
            if ack.get("duplicate"):
                queries.append({"seq": int(ack["seq"])})
                owners.append(i)
        if reprobe:
            queries.append({"seq": int(reply_json(replies[len(requests)], names.stream)["seq"])})
            owners.append("clock")
        young = sorted({r.entry for r in requests if r.slot_ms < created + LATENESS_TOLERANCE_MS
                        and (created, r.entry) not in self.born})
        for entry in young:
            queries.append({"last_by_subj": names.born_subject(entry)})
            owners.append(("born", entry))
        born = {}
        stored_ones = await session.get(nc, names.stream, queries) if queries else []
        for owner, stored in zip(owners, stored_ones):
            if owner == "clock":
                if stored is not None:
                    clock.measured(stored, t0, t1)
            elif isinstance(owner, tuple):
                born[owner[1]] = int(stored.body.get("born_ms", created)) if stored else created
                self.born[(created, owner[1])] = born[owner[1]]
            else:
                found[owner] = stored
        store_ms = round(t1 * 1000 - clock.skew.offset_ms)
        results, writes = [], []
        for i, (r, refusal) in enumerate(zip(requests, refusals)):
            if refusal is None and window_changed:
                refusal = (Outcome.FORGOTTEN, self.window.text(self.window.conflict)
                           + ": the window changed under this instance; not sent (a possible "
                           "miss)")
                if i not in found:
                    found[i] = None  # published, but the verdict is the refusal
            outcome, winner, fp, detail = self.judge(
                r, refusal, i in found, found.get(i),
                self.born.get((created, r.entry), born.get(r.entry, created)), epoch_ms)
            results.append(ClaimResult(request=r, outcome=outcome, winner=winner,
                                       winner_fingerprint=fp, store_ms=store_ms, detail=detail))
            if outcome is Outcome.WON:
                # a fresh win writes its record; a recognised retry only fills a missing one
                writes.append((r.entry, r.slot_ms, RunEvent.CLAIMED, r.task_id, 1, "", i in found))
            elif outcome.is_skip:
                writes.append((r.entry, r.slot_ms, RunEvent.for_skip(outcome), r.task_id, 1, detail,
                               True))
        if writes:
            await self.history.write(session, nc, writes)
        return results

    def judge(self, r: ClaimRequest, refusal: Refusal | None, looked: bool, stored: Stored | None,
              born: int, epoch_ms: int | None = None) -> tuple[Outcome, str | None, str, str]:
        """The outcome of one run: (outcome, winner, winner's fingerprint, detail). The verdict
        depends only on the stored claim message and the stream, so every instance (and a
        retry) reads a run the same way.

        :param looked: the run's stored claim was read (a duplicate, or a refused claim's lookup);
            otherwise this instance's publish was the first.
        :param born: the entry's memory start; ``epoch_ms``: the current epoch's, when it began
            with a change (server ms).
        """
        if stored is not None and (stored.body.get("e"), stored.body.get("s")) != (r.entry, r.slot_ms):
            stored = None  # not this run's claim
        if looked and stored is None:
            if refusal is not None:  # not claimed: the refusal stands
                return refusal[0], None, "", refusal[1]
            return (Outcome.UNKNOWN, None, "",
                    "claimed before, but the claim message could not be read back")
        if epoch_ms is not None and epoch_ms > born and r.slot_ms < epoch_ms + LATENESS_TOLERANCE_MS:
            return Outcome.FORGOTTEN, None, "", self.epoch.detail(self.epoch.marker)
        if r.slot_ms < born + LATENESS_TOLERANCE_MS:
            return (Outcome.FORGOTTEN, None, "",
                    f"store memory began at {iso(born)} (when stream {self.names.stream} was "
                    f"created); slots before {iso(born + LATENESS_TOLERANCE_MS)} are refused")
        if not looked:
            return Outcome.WON, self.instance_id, r.fingerprint, ""
        winner, fingerprint = str(stored.body.get("i")), str(stored.body.get("f", ""))
        return (Outcome.WON if winner == self.instance_id else Outcome.OTHER_WON), winner, fingerprint, ""
