"""The send queue: a won run is published through the send callback; a send that failed (nothing
reached the broker) is retried by the winner every second until max_late, then recorded as
failed; a publish that broke off (the broker may hold the message) is never published again; a
plain run whose claim answered after max_late is not sent.

The won runs of one claim are published together (:meth:`SendQueue.send_many`) inside the send
batch the scheduler provides (one producer, one connection, one pipelined write where the
transport allows it); a run counts as sent only once its batch reached the broker, and a batch
whose write broke off counts each of its runs as a publish that broke off (never published
again)."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from typing import Callable, ContextManager, Sequence

from celery_anarchon._util import log_time
from celery_anarchon.beat.engine.notes import NoteBuffer
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.errors import SendOutcomeUnknown
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import RunEvent

logger = logging.getLogger(__name__)

#: a failed send is retried at most this often, seconds
SEND_RETRY_S = 1.0

#: the send callback: (plan, slot_ms, attempt, token or None, task_id) -> None; raises on failure
SendFn = Callable[[EntryPlan, int, int, "int | None", str], None]
#: the send batch: ``batch(n)`` returns a context manager inside which up to ``n`` sends are
#: buffered. Entering raises an ``Exception`` when nothing can be published (the broker cannot
#: be reached: every send is retried); leaving writes them and raises
#: :class:`~celery_anarchon.errors.SendOutcomeUnknown` (any exception counts as one) when the
#: write broke off: each buffered publish may or may not have reached the broker
SendBatchFn = Callable[[int], ContextManager]


@dataclasses.dataclass
class Send:
    """One won run (or taken-over attempt) to publish."""
    plan: EntryPlan
    slot_ms: int
    attempt: int
    token: int | None
    task_id: str
    deadline_ms: int = 0         #: give up after this (UTC ms, wall clock): slot + max_late
    #: a takeover's send gives up at this monotonic time instead (max_late after the takeover)
    give_up_at: float | None = None
    next_try: float = 0.0        #: monotonic time of the next try
    error: str = ""

    def __post_init__(self) -> None:
        if not self.deadline_ms:
            self.deadline_ms = self.slot_ms + self.plan.max_late_ms


class SendQueue:
    """Sends, and the sends waiting for their next try.

    :param send: publishes one run; raises :class:`SendOutcomeUnknown` when the publish broke
        off, any other exception when nothing was published.
    :param clock: the wall clock, epoch seconds (max_late of a claimed run).
    :param monotonic: the clock of elapsed time (retry times, a takeover's give-up time).
    :param stats: the engine's counters (``sent``, ``send_failed``, ``send_unknown``).
    :param notes: the history-note buffer.
    :param observer: told of each send, its lateness, and each send given up.
    :param batch: the send batch of :meth:`send_many` (default: none, each send is written
        when its callback returns).
    """

    def __init__(self, send: SendFn, clock: Callable[[], float], monotonic: Callable[[], float],
                 stats: collections.Counter, notes: NoteBuffer, *,
                 observer: Observer = NOOP, batch: SendBatchFn | None = None) -> None:
        self.send_fn = send
        self.observer = observer
        self.batch_fn = batch
        self.clock = clock
        self.monotonic = monotonic
        self.stats = stats
        self.notes = notes
        self.retrying: dict[tuple[str, int], Send] = {}
        self.stopped = False

    def __bool__(self) -> bool:
        return bool(self.retrying)

    def stop(self) -> None:
        """Send nothing more (beat is shutting down)."""
        self.stopped = True

    def next_try(self) -> float | None:
        """The monotonic time of the next retry, if any."""
        return min(job.next_try for job in self.retrying.values()) if self.retrying else None

    def send(self, job: Send) -> None:
        """Publish ``job`` now; keep it for a retry if nothing reached the broker."""
        if self._publish(job):
            self._sent(job)

    def send_many(self, jobs: Sequence[Send]) -> None:
        """Publish ``jobs`` in one send batch (each as :meth:`send` would, in order). A run is
        recorded sent once the batch reached the broker; when the batch's write broke off every
        run buffered in it is recorded as a publish that broke off, never published again; when
        the batch cannot start (the broker is unreachable) every run is retried."""
        if self.batch_fn is None or len(jobs) < 2:
            for job in jobs:
                self.send(job)
            return
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.batch_fn(len(jobs)))
            except Exception as exc:  # nothing was published: each run retried until max_late
                for job in jobs:
                    self._failed(job, exc)
                return
            buffered = [job for job in jobs if self._publish(job)]
            try:
                stack.close()                  # the batch's one write
            except Exception as exc:
                for job in buffered:
                    self._unknown(job, exc)
                return
        for job in buffered:
            self._sent(job)

    def _publish(self, job: Send) -> bool:
        """Hand ``job`` to the send callback; True when it returned (published, or buffered in
        the current batch), False when it is retried, not sent or broke off (each handled)."""
        run = (job.plan.name, job.slot_ms)
        if self.stopped:
            self.retrying.pop(run, None)
            logger.warning("%s: slot %s won but not sent: beat is shutting down", job.plan.name,
                           log_time(job.slot_ms))
            return False
        if job.attempt == 1 and job.plan.timing.lease is None \
                and int(self.clock() * 1000) > job.deadline_ms:
            # the claim itself took past max_late (a slow store): too late to send. Recorded as a
            # send that failed until max_late (a skip event would not replace the claim's record).
            # A leased run is sent anyway: its record is queued, and a takeover would send it later
            self.retrying.pop(run, None)
            self.stats["send_failed"] += 1
            self.observer.send_failed(job.plan.name)
            logger.warning("%s: slot %s won but not sent: the claim answered after max_late (%g s)",
                           job.plan.name, log_time(job.slot_ms), job.plan.timing.max_late_s)
            self.notes.add(job.plan.name, job.slot_ms, RunEvent.SEND_FAILED, task_id=job.task_id,
                           attempt=job.attempt, detail="won after max_late: the claim answered too late")
            return False
        try:
            self.send_fn(job.plan, job.slot_ms, job.attempt, job.token, job.task_id)
        except SendOutcomeUnknown as exc:
            self._unknown(job, exc)
            return False
        except Exception as exc:  # nothing reached the broker: retried by the winner until max_late
            self._failed(job, exc)
            return False
        return True

    def _sent(self, job: Send) -> None:
        self.retrying.pop((job.plan.name, job.slot_ms), None)
        self.stats["sent"] += 1
        self.observer.sent(job.plan.name, job.attempt, self.clock() - job.slot_ms / 1000)
        self.observer.ran(job.plan.name, job.slot_ms)
        self.notes.add(job.plan.name, job.slot_ms, RunEvent.SENT, task_id=job.task_id,
                       attempt=job.attempt)

    def _failed(self, job: Send, exc: Exception) -> None:
        """Nothing reached the broker: ``job`` is tried again in a second, until max_late."""
        run = (job.plan.name, job.slot_ms)
        first = run not in self.retrying
        job.next_try = self.monotonic() + SEND_RETRY_S
        job.error = f"{type(exc).__name__}: {exc}"
        self.retrying[run] = job
        if first:
            logger.error("%s: slot %s won but the send failed (%s); retrying until max_late",
                         job.plan.name, log_time(job.slot_ms), job.error)

    def _unknown(self, job: Send, exc: Exception) -> None:
        """The publish broke off: the broker may hold the message, so it is never published
        again (at most one send per attempt)."""
        self.retrying.pop((job.plan.name, job.slot_ms), None)
        self.stats["send_unknown"] += 1
        self.observer.send_failed(job.plan.name, unknown=True)
        leased = job.plan.timing.lease is not None
        logger.error("%s: slot %s attempt %d: the publish broke off (%s); the broker may or may "
                     "not have the message. Not published again (at most one send per attempt)%s",
                     job.plan.name, log_time(job.slot_ms), job.attempt, exc,
                     "; if it never reaches a worker the run is taken over after its queue "
                     "deadline" if leased else "")
        self.notes.add(job.plan.name, job.slot_ms, RunEvent.SEND_UNKNOWN, task_id=job.task_id,
                       attempt=job.attempt, detail=str(exc)[:200])

    def retry(self, now: float) -> None:
        """Try again the sends whose next try came (monotonic); give up those past max_late
        (wall clock ``now``; a takeover's: its monotonic give-up time)."""
        now_ms, mono = int(now * 1000), self.monotonic()
        for run, job in list(self.retrying.items()):
            if (mono > job.give_up_at) if job.give_up_at is not None else (now_ms > job.deadline_ms):
                del self.retrying[run]
                self.stats["send_failed"] += 1
                self.observer.send_failed(job.plan.name)
                logger.error("%s: slot %s not sent: the send kept failing until max_late (%g s); "
                             "last error: %s", job.plan.name, log_time(job.slot_ms),
                             job.plan.timing.max_late_s, job.error)
                self.notes.add(job.plan.name, job.slot_ms, RunEvent.SEND_FAILED,
                               task_id=job.task_id, attempt=job.attempt, detail=job.error[:200])
            elif mono >= job.next_try:
                self.send(job)
