"""The claim queues of the RabbitMQ store: the start-up probe of the broker, the namespace's
slot_ttl marker, and the two phases of a claim batch (declare, then publish with confirms).
A part of :class:`~celery_anarchon.stores.rabbitmq.store.RabbitMQStore` (its module docstring
explains the design: "A claim", "Who won"), given what it needs of the store.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
import amqp

from celery_anarchon._util import LATENESS_TOLERANCE_MS, iso
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores.base import ClaimRequest, Outcome
from celery_anarchon.stores.rabbitmq.connection import (
    QueueNames, Session, claim_arguments, inequivalent, settings_arguments,
)
from celery_anarchon.stores.rabbitmq.memory import MemoryStarts, local_ms

logger = logging.getLogger(__name__)

#: declares of one batch are spread over up to this many channels (the broker creates queues of
#: different channels in parallel: 368 -> 719 new queues/s from 1 to 4 channels on this machine)
DECLARE_CHANNELS = 4
DECLARES_PER_CHANNEL = 16
#: how long this process remembers a claim whose answer it never heard, seconds past slot_ttl
UNCERTAIN_KEEP_S = 60.0

_CHANNEL_REFUSALS = (amqp.exceptions.NotFound, amqp.exceptions.PreconditionFailed)

Run = tuple[str, int]
#: a run's answer before it becomes a ClaimResult: the outcome and its detail
Answers = dict[Run, tuple[Outcome, str]]


class ClaimQueues:
    """The claim queues of one namespace, and what this process remembers of claims whose
    answer it did not hear or did not hand back.

    :param names: the namespace's queue names.
    :param memory: the entries' memory starts, which decide ``FORGOTTEN``.
    :param slot_ttl_s: the claim queues' expiry, seconds (the store's memory).
    :param claim_timeout: seconds each awaited frame may take.
    :param warn_once: ``warn_once(message)``: log ``message`` once per store (ERROR).
    """

    def __init__(self, *, names: QueueNames, memory: MemoryStarts, namespace: str,
                 instance_id: str, safe_url: str, slot_ttl_s: float, slot_ttl_ms: int,
                 claim_timeout: float, warn_once: Callable[..., None]) -> None:
        self.names = names
        self.memory = memory
        self.namespace = namespace
        self.instance_id = instance_id
        self.safe_url = safe_url
        self.slot_ttl_s = slot_ttl_s
        self.slot_ttl_ms = slot_ttl_ms
        self.claim_timeout = claim_timeout
        self._warn_once = warn_once
        #: runs whose claim this process published without hearing the answer -> monotonic time
        self.uncertain: dict[Run, float] = {}
        #: runs acked in a batch that then failed (the caller never saw the WON) -> monotonic time
        self.undelivered: dict[Run, float] = {}

    # -- start-up ---------------------------------------------------------------------------------
    def probe(self, s: Session) -> None:
        """Two publishes to a new probe claim queue must give ack then nack, and one to a missing
        queue must be returned.

        :raises ConfigError: this broker cannot decide claims (naming what it answered).
        """
        name = self.names.probe(uuid.uuid4().hex)
        ch = s.channel()
        ch.queue_declare(name, durable=True, auto_delete=False,
                         arguments=claim_arguments(min(self.slot_ttl_ms, 60_000)))
        confirms = s.confirms()
        body = {"probe": self.instance_id}
        tags = [confirms.publish(name, body), confirms.publish(name, body),
                confirms.publish(name + ".missing", body)]
        confirms.wait(self.claim_timeout)
        answers = [confirms.acked(tag) for tag in tags[:2]]
        returned = name + ".missing" in confirms.returned
        s.retire_confirms()
        ch.queue_delete(name)
        ch.close()
        where = f"RabbitMQ store {self.safe_url}"
        if answers != [True, False]:
            raise ConfigError(
                f"{where}: the broker answered {answers} (True = ack) to two claims of one run on "
                "a classic queue with x-max-length 1 and x-overflow reject-publish; it must ack "
                "the first and nack the second. A policy or plugin changes these queues (quorum "
                "queues behave like this and let two claims in); check the policies that match "
                f"{self.names.prefix}.claim.* (rabbitmqctl list_policies / list_operator_policies).")
        if not returned:
            raise ConfigError(f"{where}: a mandatory publish to a queue that does not exist was not "
                              "returned by the broker; a claim could be counted as won without a "
                              "queue to decide it. Check the broker (an alternate-exchange policy "
                              "on the default exchange?).")

    def check_settings(self, s: Session) -> str | None:
        """Declare the namespace's marker; the broker's 406 says another slot_ttl is in use.

        :returns: the error text naming both values, or ``None`` when this slot_ttl is the one.
        """
        ch = s.channel()
        try:
            ch.queue_declare(self.names.settings(), durable=True, auto_delete=False,
                             arguments=settings_arguments(self.slot_ttl_ms))
        except amqp.exceptions.PreconditionFailed as exc:
            return settings_refusal(exc, self.slot_ttl_s, self.namespace, self.names.settings(),
                                    self.safe_url)
        ch.close()
        return None

    # -- a batch ----------------------------------------------------------------------------------
    def decide(self, s: Session, first: dict[Run, ClaimRequest]) -> Answers:
        """The broker's answer to each run of ``first`` (docs/design.md "One run, in time" step 3):
        a run acked in an earlier batch that failed is WON; the others are declared (phase 1:
        forgotten or refused runs answered there) and published (phase 2).

        :raises: the driver's errors (the store translates them); runs published without an
            answer are then remembered as uncertain.
        """
        self.expire()
        answers: Answers = {}
        for run in [r for r in first if r in self.undelivered]:
            del self.undelivered[run]
            answers[run] = (Outcome.WON, "")
        pending = [run for run in first if run not in answers]
        if pending:
            refused, publish = s.ensure(lambda: self.declare(s, pending))
            answers.update(refused)
            answers.update(self.publish(s, publish, first))
        return answers

    def expire(self) -> None:
        """Forget uncertain and undelivered runs older than slot_ttl + ``UNCERTAIN_KEEP_S``."""
        horizon = time.monotonic() - self.slot_ttl_s - UNCERTAIN_KEEP_S
        for memo in (self.uncertain, self.undelivered):
            for run in [run for run, at in memo.items() if at < horizon]:
                del memo[run]

    def declare(self, s: Session, runs: list[Run]) -> tuple[Answers, list[Run]]:
        """Phase 1: refuse forgotten runs, declare the others' claim queues, check the entries'
        memory starts and the namespace's slot_ttl, all in one pipeline.

        :returns: ``(refused, to_publish)``: answers for runs that must not be published, and the
            runs to publish. Idempotent (kombu's ``ensure`` may run it again on a new connection).
        """
        entries = list(dict.fromkeys(entry for entry, _ in runs))
        for entry in entries:
            self.memory.born(s, entry)
        try:
            self._declare_fast(s, entries, runs)
            refused: Answers = {}
        except _CHANNEL_REFUSALS:
            s.drop_declarers()
            refused = self._declare_slow(s, entries, runs)
        for run in runs:
            if run not in refused:
                born = self.memory.born(s, run[0])
                if run[1] < born + LATENESS_TOLERANCE_MS:
                    refused[run] = (Outcome.FORGOTTEN, f"store memory began at {iso(born)} (queue "
                                    f"{self.names.born(run[0])})")
        return refused, [run for run in runs if run not in refused]

    def _declare_fast(self, s: Session, entries: list[str], runs: list[Run]) -> None:
        """Every declare ``nowait``, spread over a few channels, then one synchronous call per
        channel: the broker handles a channel's frames in order, so its answer means every declare
        before it succeeded. A refusal closes its channel and raises here."""
        channels = s.declare_channels(min(DECLARE_CHANNELS, 1 + len(runs) // DECLARES_PER_CHANNEL))
        head = channels[0]
        head.queue_declare(self.names.settings(), durable=True, auto_delete=False, nowait=True,
                           arguments=settings_arguments(self.slot_ttl_ms))
        for entry in entries:
            head.queue_declare(self.names.born(entry), passive=True, nowait=True)
        arguments = claim_arguments(self.slot_ttl_ms)
        for i, run in enumerate(runs):
            channels[i % len(channels)].queue_declare(self.names.claim(*run), durable=True,
                                                      auto_delete=False, arguments=arguments,
                                                      nowait=True)
        for ch in channels:
            ch.basic_qos(0, 0, False)

    def _declare_slow(self, s: Session, entries: list[str], runs: list[Run]) -> Answers:
        """The pipeline was refused: declare one by one to learn which queue (a refusal closes the
        channel, so a new one follows each). A missing born queue means the broker forgot the
        entry: its memory starts again now. Returns answers for the runs that cannot be claimed."""
        detail = self.check_settings(s)
        if detail:
            self._warn_once(detail)
            return {run: (Outcome.FORGOTTEN, detail) for run in runs}  # docs/design.md "Amnesia"
        ch = s.channel()
        failed: Answers = {}
        for entry in entries:
            try:
                ch.queue_declare(self.names.born(entry), passive=True)
            except amqp.exceptions.NotFound:
                ch = s.channel()
                s.born.pop(entry, None)
                logger.warning("RabbitMQ store %s: the broker lost the memory start of entry %r "
                               "(queue %s): runs before now + 10 s are refused as forgotten",
                               self.safe_url, entry, self.names.born(entry))
                self.memory.born(s, entry)
        arguments = claim_arguments(self.slot_ttl_ms)
        for run in runs:
            queue = self.names.claim(*run)
            try:
                ch.queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)
            except amqp.exceptions.PreconditionFailed as exc:
                ch = s.channel()
                failed[run] = (Outcome.UNKNOWN, queue_refusal(queue, exc, self.slot_ttl_ms))
                self._warn_once(failed[run][1])
        ch.close()
        return failed

    def publish(self, s: Session, runs: list[Run], first: dict[Run, ClaimRequest]) -> Answers:
        """Phase 2: one persistent, mandatory publish per run, then every confirm: ack WON, nack
        OTHER_WON (or UNKNOWN for a run whose earlier claim got no answer), returned UNKNOWN.
        Not retried: on an error, runs without an answer become uncertain and acked ones
        undelivered, and the error is raised."""
        if not runs:
            return {}
        confirms = s.confirms()
        tags: dict[Run, int] = {}
        attempted: list[Run] = []
        try:
            for run in runs:
                request = first[run]
                attempted.append(run)  # a publish that raised may still have reached the broker
                tags[run] = confirms.publish(self.names.claim(*run), {
                    "instance": self.instance_id, "fingerprint": request.fingerprint,
                    "task_id": request.task_id, "namespace": self.namespace, "entry": run[0],
                    "slot_ms": run[1], "claimed_ms": local_ms()})
            confirms.wait(self.claim_timeout)
        except BaseException:
            now = time.monotonic()
            for run in attempted:
                answer = confirms.acked(tags[run]) if run in tags else None
                if answer is None:
                    self.uncertain[run] = now
                elif answer and self.names.claim(*run) not in confirms.returned:
                    self.uncertain.pop(run, None)
                    self.undelivered[run] = now
            raise
        answers: Answers = {}
        for run, tag in tags.items():
            queue = self.names.claim(*run)
            retried = self.uncertain.pop(run, None) is not None
            if queue in confirms.returned:
                answers[run] = (Outcome.UNKNOWN, f"claim queue {queue!r} vanished before the "
                                "claim reached it (the broker returned it: NO_ROUTE); not a win")
            elif confirms.acked(tag):
                answers[run] = (Outcome.WON, "")
            elif retried:
                answers[run] = (Outcome.UNKNOWN, "an earlier claim of this run by this instance got "
                                "no answer, and the broker cannot tell who won (RabbitMQ): counted "
                                "as lost")
            else:
                answers[run] = (Outcome.OTHER_WON, "")
        if confirms.tainted:
            s.retire_confirms()
        return answers


def settings_refusal(exc: BaseException, slot_ttl_s: float, namespace: str, marker: str,
                     safe_url: str) -> str:
    """The text of a declare of the namespace's ``marker`` queue refused because another slot_ttl
    is in use (``exc``: the broker's 406), naming both values, with the fix."""
    found = inequivalent(exc)
    theirs = f"{int(found[2]) / 1000:g} s" if found and found[2].isdigit() else "another value"
    return (f"RabbitMQ store {safe_url}: anarchon_store_options['slot_ttl'] is "
            f"{slot_ttl_s:g} s here, but namespace {namespace!r} already claims with "
            f"slot_ttl {theirs} (queue {marker!r}; broker: "
            f"{getattr(exc, 'reply_text', exc)}). Every instance must use the same slot_ttl: "
            "a claim queue that expires sooner forgets a run before a later claimer's window "
            "closes. Fix: give every instance the same slot_ttl; to change it, stop every "
            f"instance, wait the old slot_ttl, delete that queue (rabbitmqctl delete_queue "
            f"{marker}) and start them with the new value.")


def queue_refusal(queue: str, exc: BaseException, slot_ttl_ms: int) -> str:
    """The detail of a claim whose ``queue`` the broker refused to declare (``exc``: its 406,
    the queue was declared elsewhere with other arguments): outcome unknown, with the fix."""
    found = inequivalent(exc)
    if found and found[0] == "x-expires":
        ours, theirs = f"{slot_ttl_ms} ms", f"{found[2]} ms"
        what = f"another slot_ttl (x-expires {theirs}; this instance uses {ours})"
    elif found and found[0] == "x-queue-type":
        what = (f"queue type {found[2]!r} (quorum queues let two claims in; this store "
                "declares classic queues only)")
    else:
        what = "other arguments"
    return (f"claim queue {queue!r} was declared elsewhere with {what}; the broker refused "
            f"this claim ({getattr(exc, 'reply_text', exc)}). Outcome unknown: a possible miss, "
            "never a second winner. Fix: give every instance the same slot_ttl and queue type.")
