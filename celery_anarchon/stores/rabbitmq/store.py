"""The RabbitMQ store (DESIGN.md store memory table: RabbitMQ): the broker decides every claim.

URLs ``amqp://user:password@host:5672/vhost`` and ``amqps://...`` go to kombu (py-amqp)
unchanged; the ``ssl`` store option (``True`` or a dict of TLS settings) is kombu's ``ssl``
argument, passed as it is.

**A claim.** Each run (entry, slot) has its own durable *classic* queue
``<prefix>.claim.<namespace>.<entry>.<slot_ms>`` with ``x-max-length`` 1, ``x-overflow``
``reject-publish`` and ``x-expires`` = ``slot_ttl``. Every claimer declares it and publishes one
persistent message (mandatory, publisher confirms). The broker keeps the first message and nacks
every later one, so the ack decides the winner; the message body records it (instance id,
fingerprint, task id: JSON). A batch takes three round trips whatever its size: (1) every declare
pipelined (``nowait``) over a few channels, closed by one synchronous call per channel; (2) every
publish, then the confirms; (3) the batch's history events, then their confirms.

* A publish the broker could not route (the queue vanished between declare and publish) is
  returned (NO_ROUTE) and never counts as a win; the channel that saw it is retired.
* Quorum queues let two claims in (store-primitives.md §7): every queue is declared with
  ``x-queue-type: classic`` (a vhost whose default type is quorum, or a quorum queue declared
  elsewhere under our name, gives a 406 instead of a silent quorum queue), the ``queue_type``
  option accepts only ``"classic"``, and :meth:`RabbitMQStore.prepare` checks the broker's
  behaviour on a probe claim queue: first publish acked, second nacked, a publish to a missing
  queue returned. A policy cannot change a queue's type, and RabbitMQ lets the queue's own
  ``x-max-length`` / ``x-overflow`` win over a policy's (measured on 3.10); what this cannot see is
  an operator policy with a shorter ``expires`` (it shortens the memory) or classic mirroring
  (``ha-mode``: a failover to an unsynchronised mirror forgets claims).
* A claim queue declared elsewhere with other arguments (another ``slot_ttl``) is refused by the
  broker (406): that run answers ``UNKNOWN`` (a possible miss, never a second winner) and the
  error names both values. Every instance must use one ``slot_ttl``: a queue whose ``x-expires``
  is shorter forgets a run before a later claimer's window closes. So each namespace has a
  marker queue ``<prefix>.settings.<namespace>`` (no expiry) whose ``x-message-ttl`` carries the
  ``slot_ttl``: a different value is a ConfigError at start-up, and every batch re-declares it (in
  the same pipeline), so a change under a running instance makes its claims ``FORGOTTEN`` (both
  values named: a possible miss; loss-spec point 5).

**Who won** (DESIGN.md "Who won"): the winner cannot be read back. Reading the claim message, even
to requeue it, empties the queue for a moment (an unacked message does not count towards
``x-max-length``) and lets a second claim in; a passive declare tells only that *someone*
claimed, not who. So ``recognises_winner`` is False: a nack is ``LOST`` with ``winner=None``, and
a run whose earlier claim by this process timed out (the answer never came) is ``UNKNOWN`` when
retried and nacked: a possible miss, never a duplicate. Runs acked before such a failure are
answered ``WON`` on the retry (this process heard the ack). Losers cannot learn the winner's
fingerprint, so the rolling-deploy warning of DESIGN.md "One run" step 8 does not fire here.

**Memory** (``slot_ttl``, seconds, default 300): the broker deletes a claim queue ``slot_ttl``
after its last *use*; the claim that creates it starts the period, and the later claims do not
extend it (their declares are pipelined with ``nowait``, which RabbitMQ does not count as use;
measured on 3.10), so a run is remembered at least ``slot_ttl`` after its first claim, and a claim
after that wins again. There is no store clock (:meth:`RabbitMQStore.now_ms` is ``None``): the
instances' clocks decide lateness, so **the skew between the fastest and the slowest instance plus
jitter + max_late must stay under slot_ttl** (DESIGN.md, the paragraph after the memory table): a
run's window opens at the fastest instance's claim and must still be open at the slowest one's.

**Amnesia** (DESIGN.md "Amnesia"): a durable queue ``<prefix>.born.<namespace>.<entry>`` (no
expiry, one message, first writer wins) holds the clock of the instance that began the entry's
memory. It is read once per connection (under the entry's lock, see below) and every claim batch
checks, in the declare pipeline, that it still exists: a broker that lost it (a node reset, a lost
disk, a deleted queue) gets a new one, and slots before its start + 10 s are ``FORGOTTEN``. A
broker restart closes every connection, so no instance keeps a memory start across it. Cost: one
queue per entry and one passive declare per entry per batch (no extra round trip). The start is
on the creating instance's clock, so the skew limit above applies to it too.

**History**: one durable queue per entry, ``x-max-length`` = 4 x ``history_size`` events,
oldest dropped first; writers append events (no read); :meth:`RabbitMQStore.history` folds them
(one record per run, a later event replaces an earlier one, skip events only fill). Reading takes
every message unacked and gives them back in place, under an exclusive queue
``<prefix>.lock.<namespace>.<entry>`` (held by one connection at a time, freed if it dies), so two
readers never see a half-empty queue; the memory start is read under the same lock. A history
queue declared with another ``history_size`` is kept as it is (a warning). ``store_ms`` of a
record is the recording instance's clock.

Queue names escape namespace and entry (:func:`~celery_anarchon.stores.rabbitmq.protocol.escape`) and
hash pairs too long for AMQP's 255 bytes. The AMQP plumbing (names, arguments, confirms, the
session) is in :mod:`~celery_anarchon.stores.rabbitmq.protocol`; the per-entry queues (lock, memory
start, history) in :mod:`~celery_anarchon.stores.rabbitmq.entries`. Queues of entries removed from
the schedule stay (one born and one history queue each, a few bytes).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable, Sequence

import amqp
import kombu
import kombu.exceptions

from celery_anarchon import _util
from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import reject_unknown_options, scheme_of, translated
from celery_anarchon.stores.base import (
    DEFAULT_CLAIM_TIMEOUT_S, DEFAULT_HISTORY_SIZE, LATENESS_TOLERANCE_MS, ClaimRequest,
    ClaimResult, ClaimStore, HistoryRecord, Memory, Outcome, RunEvent,
)
from celery_anarchon.stores.rabbitmq.protocol import (
    QueueNames, Session, claim_arguments, inequivalent, settings_arguments, valid_prefix,
)
from celery_anarchon._util import iso
from celery_anarchon.stores.rabbitmq.entries import EntryQueues, local_ms

logger = logging.getLogger(__name__)

#: Options of ``anarchon_store_options`` this store understands (besides the common ones).
OPTIONS = frozenset({"slot_ttl", "queue_type", "queue_prefix", "ssl"})
#: Default memory of a claimed run, seconds (DESIGN.md memory table).
DEFAULT_SLOT_TTL_S = 300.0
DEFAULT_QUEUE_PREFIX = "anarchon"
#: declares of one batch are spread over up to this many channels (the broker creates queues of
#: different channels in parallel: 368 -> 719 new queues/s from 1 to 4 channels on this machine)
DECLARE_CHANNELS = 4
DECLARES_PER_CHANNEL = 16
#: how long this process remembers a claim whose answer it never heard, seconds past slot_ttl
UNCERTAIN_KEEP_S = 60.0

_CHANNEL_REFUSALS = (amqp.exceptions.NotFound, amqp.exceptions.PreconditionFailed)


def _seconds(name: str, value) -> float:
    """A store option in seconds (int, float or timedelta), > 0, else ConfigError naming it."""
    seconds = _util.duration(value, f"anarchon_store_options[{name!r}]")
    if seconds <= 0:
        raise ConfigError(f"anarchon_store_options[{name!r}] = {value!r}: must be more than 0 seconds")
    return seconds


class RabbitMQStore(ClaimStore):
    """RabbitMQ: one classic queue per run decides its claim (see the module docstring).

    :param slot_ttl: seconds a claimed run is remembered after its first claim (default 300):
        the claim queues' ``x-expires``. Every instance must use the same value.
    :param queue_type: only ``"classic"`` (quorum queues let two claims in).
    :param queue_prefix: first part of every queue name (default ``"anarchon"``; letters, digits,
        ``_`` and ``-``).
    :param ssl: kombu's ``ssl`` argument (``True`` or a dict of TLS settings), passed unchanged.
    :param history_size: runs of history kept per entry (default 100).
    :param claim_timeout: seconds one round trip may take (connect, and each frame awaited).
    """

    kind = "rabbitmq"
    #: the driver errors that mean "unreachable or no answer" (kombu's ``connection_errors``)
    connection_errors = (amqp.exceptions.AMQPError, kombu.exceptions.KombuError, OSError)
    checks_lateness = False
    recognises_winner = False

    def __init__(self, url: str, *, namespace: str, instance_id: str, **options) -> None:
        reject_unknown_options(self.kind, options, OPTIONS)
        history_size = options.get("history_size", DEFAULT_HISTORY_SIZE)
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise ConfigError(f"anarchon_store_options['history_size'] = {history_size!r}: must be "
                              "an integer >= 1")
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=history_size,
                         claim_timeout=_seconds("claim_timeout",
                                                options.get("claim_timeout", DEFAULT_CLAIM_TIMEOUT_S)))
        self.slot_ttl_s = _seconds("slot_ttl", options.get("slot_ttl", DEFAULT_SLOT_TTL_S))
        self.slot_ttl_ms = max(1, math.ceil(self.slot_ttl_s * 1000))
        queue_type = options.get("queue_type", "classic")
        if queue_type != "classic":
            raise ConfigError(
                f"anarchon_store_options['queue_type'] = {queue_type!r}: the RabbitMQ store works "
                "on classic queues only. A quorum queue checks x-max-length after it took the "
                "message, so two claims of one run both win (measured: 163 of 200 runs raced by 3 "
                "processes had two winners), and streams never refuse a message. Remove the "
                "option or set it to 'classic'.")
        prefix = options.get("queue_prefix", DEFAULT_QUEUE_PREFIX)
        if not valid_prefix(prefix):
            raise ConfigError(f"anarchon_store_options['queue_prefix'] = {prefix!r}: 1 to 64 "
                              "letters, digits, '_' or '-' (no dots: they separate a name's parts)")
        ssl = options.get("ssl")
        if ssl is not None and not isinstance(ssl, (bool, dict)):
            raise ConfigError(f"anarchon_store_options['ssl'] = {ssl!r}: True, False or a dict of "
                              "TLS settings (kombu's ssl argument)")
        scheme = scheme_of(url)
        if scheme not in ("amqp", "amqps"):
            raise ConfigError(f"anarchon_store_url {self.safe_url!r}: the RabbitMQ store takes "
                              "amqp:// or amqps:// URLs")
        self.ssl = ssl if ssl is not None else (scheme == "amqps")
        self.names = QueueNames(prefix, namespace)
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._probed = False
        self._warned: set[str] = set()
        #: runs whose claim this process published without hearing the answer -> monotonic time
        self._uncertain: dict[tuple[str, int], float] = {}
        #: runs acked in a batch that then failed (the caller never saw the WON) -> monotonic time
        self._undelivered: dict[tuple[str, int], float] = {}
        #: each entry's lock, memory start and history: a part given what it needs of this store
        self._entries = EntryQueues(
            names=self.names, namespace=self.namespace, instance_id=self.instance_id,
            safe_url=self.safe_url, claim_timeout=self.claim_timeout,
            history_size=self.history_size, using=self._using, drop=self._drop,
            warn_once=self._warn_once)

    # -- identity -----------------------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        return Memory(duration_s=self.slot_ttl_s, setting="slot_ttl")

    def describe(self) -> str:
        return f"rabbitmq slot_ttl={self.slot_ttl_s:g}s"

    def now_ms(self) -> None:
        """``None``: AMQP exposes no broker clock; the instances' clocks decide lateness."""
        return None

    # -- connections --------------------------------------------------------------------------
    def _current(self) -> Session:
        session = self._session
        if session is not None and session.pid != os.getpid():
            session = None  # forked: never touch the parent's socket
        if session is None:
            session = self._session = Session(self.url, self.ssl, self.claim_timeout)
        return session

    def _drop(self) -> None:
        """Forget the session after an error (its connection may hold unread frames)."""
        session, self._session = self._session, None
        if session is not None and session.pid == os.getpid():
            with contextlib.suppress(Exception):
                session.conn.collect()

    @contextlib.contextmanager
    def _using(self, doing: str):
        """The current session; any broker or socket error becomes StoreUnavailable naming the
        masked URL and the cause, and the session is dropped."""
        with self._lock:
            session = self._current()
            with translated("RabbitMQ", self.safe_url, doing, self.connection_errors,
                            cause=self._cause, on_error=self._drop):
                yield session

    def _cause(self, exc: BaseException) -> str:
        if isinstance(exc, amqp.exceptions.AccessRefused):
            return (f" failed: the broker refused access ({exc.reply_text or exc}); check the user "
                    "name, password and virtual host of anarchon_store_url and the user's "
                    "permissions there")
        cause = str(exc) or f"no answer within claim_timeout ({self.claim_timeout:g} s)"
        return f" failed: {type(exc).__name__}: {cause}"

    def close(self) -> None:
        """Release the connection; idempotent and safe in a signal handler (no lock taken)."""
        session, self._session = self._session, None
        if session is not None and session.pid == os.getpid():
            with contextlib.suppress(Exception):
                session.conn.release()

    # -- life cycle ---------------------------------------------------------------------------
    def prepare(self, entries: Iterable[str]) -> list[str]:
        """Connect, check the broker's behaviour (once per store), check that this namespace's
        instances all use this ``slot_ttl``, and create the history queue and memory start of
        each entry that has none.

        :returns: warnings: a history queue declared with another size, and always
            :meth:`durability_note` (what a confirmed claim survives).
        :raises ConfigError: the broker accepts two claims of one run, or instances of this
            namespace use another ``slot_ttl``.
        :raises StoreUnavailable: the broker cannot be reached or refused the login.
        """
        entries = list(dict.fromkeys(entries))
        warnings: list[str] = []
        with self._using("prepare") as s:
            s.connect()
            if not self._probed:
                self._probe(s)
                self._probed = True
            error = self._check_settings(s)
            if error:
                raise ConfigError(error)
            for entry in entries:
                warning = self._entries.ensure_history(s, entry)
                if warning:
                    warnings.append(warning)
                self._entries.born(s, entry)
        warnings.append(self.durability_note())
        return warnings

    def durability_note(self) -> str:
        """What publisher confirms on durable classic queues promise when a node is lost (the
        start-up warning; docs/stores.md "RabbitMQ", "Node loss")."""
        return (f"RabbitMQ store {self.safe_url}: each run is decided by a durable classic queue "
                "that lives on one node, and the broker confirms a claim once that node wrote it "
                "to disk (a persistent message on a durable queue), so a restart or a crash of "
                "the node keeps it. A node lost with its disk loses the claim queues it held: on "
                "a single node the entries' memory-start queues go with them and the lost runs "
                "are refused as 'forgotten'; on a cluster an entry's memory-start queue may live "
                "on another node and survive, so runs whose claim queues were on the lost node "
                "can be won again. Claim queues are never replicated: quorum queues are refused "
                "(they let two claims in) and classic mirroring (ha-mode) can lose claims on a "
                "failover. For claims that survive the loss of a node, run a store that "
                "replicates them (a NATS JetStream cluster with replicas=3).")

    def _probe(self, s: Session) -> None:
        """Two publishes to a new probe claim queue must give ack then nack, and one to a missing
        queue must be returned; otherwise this broker cannot decide claims (ConfigError)."""
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

    def _check_settings(self, s: Session) -> str | None:
        """Declare the namespace's marker; the broker's 406 says another slot_ttl is in use."""
        ch = s.channel()
        try:
            ch.queue_declare(self.names.settings(), durable=True, auto_delete=False,
                             arguments=settings_arguments(self.slot_ttl_ms))
        except amqp.exceptions.PreconditionFailed as exc:
            return self._settings_error(exc)
        ch.close()
        return None

    def _settings_error(self, exc: BaseException) -> str:
        found = inequivalent(exc)
        theirs = f"{int(found[2]) / 1000:g} s" if found and found[2].isdigit() else "another value"
        return (f"RabbitMQ store {self.safe_url}: anarchon_store_options['slot_ttl'] is "
                f"{self.slot_ttl_s:g} s here, but namespace {self.namespace!r} already claims with "
                f"slot_ttl {theirs} (queue {self.names.settings()!r}; broker: "
                f"{getattr(exc, 'reply_text', exc)}). Every instance must use the same slot_ttl: "
                "a claim queue that expires sooner forgets a run before a later claimer's window "
                "closes. Fix: give every instance the same slot_ttl; to change it, stop every "
                f"instance, wait the old slot_ttl, delete that queue (rabbitmqctl delete_queue "
                f"{self.names.settings()}) and start them with the new value.")

    # -- claims -------------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch (DESIGN.md "One run, in time" step 3): forgotten (before the memory
        start + 10 s), then the broker decides each run: ack WON, nack LOST (winner unknown), a
        publish returned or a queue declared with other arguments UNKNOWN. Skips and wins are
        recorded in the history in the same batch.

        :raises StoreUnavailable: the broker could not be reached or an answer did not come in
            ``claim_timeout`` seconds; a retry of a run whose answer never came is UNKNOWN unless
            the broker acks it then.
        """
        if not requests:
            return []
        first: dict[tuple[str, int], ClaimRequest] = {}
        for request in requests:
            first.setdefault(request.run, request)
        answers: dict[tuple[str, int], tuple[Outcome, str]] = {}
        with self._using(f"claiming {len(first)} run(s)") as s:
            self._expire_uncertain()
            for run in [r for r in first if r in self._undelivered]:
                del self._undelivered[run]
                answers[run] = (Outcome.WON, "")
            pending = [run for run in first if run not in answers]
            if pending:
                refused, publish = s.ensure(lambda: self._declare_runs(s, pending))
                answers.update(refused)
                answers.update(self._publish_claims(s, publish, first))
            notes = [self._claim_note(first[run], outcome, detail)
                     for run, (outcome, detail) in answers.items()
                     if outcome in (Outcome.WON, Outcome.FORGOTTEN, Outcome.UNKNOWN)]
            try:
                self._entries.publish_history(s, notes)
            except (*self.connection_errors, StoreUnavailable) as exc:
                logger.warning("RabbitMQ store %s: claims decided, but their history was not "
                               "recorded: %s: %s", self.safe_url, type(exc).__name__, exc)
                self._drop()
        return [ClaimResult(request=r, outcome=answers[r.run][0], detail=answers[r.run][1],
                            winner=self.instance_id if answers[r.run][0] is Outcome.WON else None)
                for r in requests]

    def _expire_uncertain(self) -> None:
        horizon = time.monotonic() - self.slot_ttl_s - UNCERTAIN_KEEP_S
        for memo in (self._uncertain, self._undelivered):
            for run in [run for run, at in memo.items() if at < horizon]:
                del memo[run]

    def _declare_runs(self, s: Session, runs: list[tuple[str, int]]):
        """Phase 1: refuse forgotten runs, declare the others' claim queues, check the entries'
        memory starts and the namespace's slot_ttl, all in one pipeline.

        :returns: ``(refused, to_publish)``: answers for runs that must not be published, and the
            runs to publish. Idempotent (kombu's ``ensure`` may run it again on a new connection).
        """
        entries = list(dict.fromkeys(entry for entry, _ in runs))
        for entry in entries:
            self._entries.born(s, entry)
        try:
            self._declare_fast(s, entries, runs)
            failed: dict[tuple[str, int], tuple[Outcome, str]] = {}
        except _CHANNEL_REFUSALS:
            s.drop_declarers()
            failed = self._declare_slow(s, entries, runs)
        refused = dict(failed)
        for run in runs:
            if run not in refused:
                born = self._entries.born(s, run[0])
                if run[1] < born + LATENESS_TOLERANCE_MS:
                    refused[run] = (Outcome.FORGOTTEN, f"store memory began at {iso(born)} (queue "
                                    f"{self.names.born(run[0])})")
        return refused, [run for run in runs if run not in refused]

    def _declare_fast(self, s: Session, entries: list[str], runs: list[tuple[str, int]]) -> None:
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

    def _declare_slow(self, s: Session, entries: list[str], runs: list[tuple[str, int]]):
        """The pipeline was refused: declare one by one to learn which queue (a refusal closes the
        channel, so a new one follows each). A missing born queue means the broker forgot the
        entry: its memory starts again now. Returns answers for the runs that cannot be claimed."""
        ch = s.channel()
        failed: dict[tuple[str, int], tuple[Outcome, str]] = {}
        try:
            ch.queue_declare(self.names.settings(), durable=True, auto_delete=False,
                             arguments=settings_arguments(self.slot_ttl_ms))
        except amqp.exceptions.PreconditionFailed as exc:
            detail = self._settings_error(exc)
            self._warn_once(detail)
            return {run: (Outcome.FORGOTTEN, detail) for run in runs}  # loss-spec point 5
        for entry in entries:
            try:
                ch.queue_declare(self.names.born(entry), passive=True)
            except amqp.exceptions.NotFound:
                ch = s.channel()
                s.born.pop(entry, None)
                logger.warning("RabbitMQ store %s: the broker lost the memory start of entry %r "
                               "(queue %s): runs before now + 10 s are refused as forgotten",
                               self.safe_url, entry, self.names.born(entry))
                self._entries.born(s, entry)
        arguments = claim_arguments(self.slot_ttl_ms)
        for run in runs:
            queue = self.names.claim(*run)
            try:
                ch.queue_declare(queue, durable=True, auto_delete=False, arguments=arguments)
            except amqp.exceptions.PreconditionFailed as exc:
                ch = s.channel()
                failed[run] = (Outcome.UNKNOWN, self._claim_queue_error(queue, exc))
                self._warn_once(failed[run][1])
        ch.close()
        return failed

    def _claim_queue_error(self, queue: str, exc: BaseException) -> str:
        found = inequivalent(exc)
        if found and found[0] == "x-expires":
            ours, theirs = f"{self.slot_ttl_ms} ms", f"{found[2]} ms"
            what = f"another slot_ttl (x-expires {theirs}; this instance uses {ours})"
        elif found and found[0] == "x-queue-type":
            what = (f"queue type {found[2]!r} (quorum queues let two claims in; this store "
                    "declares classic queues only)")
        else:
            what = "other arguments"
        return (f"claim queue {queue!r} was declared elsewhere with {what}; the broker refused "
                f"this claim ({getattr(exc, 'reply_text', exc)}). Outcome unknown: a possible miss, "
                "never a second winner. Fix: give every instance the same slot_ttl and queue type.")

    def _warn_once(self, message: str, level: int = logging.ERROR) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.log(level, "RabbitMQ store %s: %s", self.safe_url, message)

    def _publish_claims(self, s: Session, runs: list[tuple[str, int]],
                        first: dict[tuple[str, int], ClaimRequest]):
        """Phase 2: one persistent, mandatory publish per run, then every confirm. Not retried:
        on an error, runs without an answer become uncertain and acked ones undelivered."""
        if not runs:
            return {}
        confirms = s.confirms()
        tags: dict[tuple[str, int], int] = {}
        attempted: list[tuple[str, int]] = []
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
                    self._uncertain[run] = now
                elif answer and self.names.claim(*run) not in confirms.returned:
                    self._uncertain.pop(run, None)
                    self._undelivered[run] = now
            raise
        answers = {}
        for run, tag in tags.items():
            queue = self.names.claim(*run)
            retried = self._uncertain.pop(run, None) is not None
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

    def _claim_note(self, request: ClaimRequest, outcome: Outcome, detail: str) -> HistoryRecord:
        event = RunEvent.CLAIMED if outcome is Outcome.WON else RunEvent.for_skip(outcome)
        return HistoryRecord(request.entry, request.slot_ms, event, task_id=request.task_id,
                             detail=detail[:500])

    # -- history (:class:`~.entries.EntryQueues`) -----------------------------------------------
    def record(self, entry: str, slot_ms: int, event: RunEvent, *, task_id: str = "",
               attempt: int = 1, detail: str = "") -> None:
        self._entries.record(entry, slot_ms, event, task_id=task_id, attempt=attempt, detail=detail)

    def record_many(self, notes: Sequence[HistoryRecord]) -> None:
        self._entries.record_many(notes)

    def history(self, entry: str, limit: int | None = None) -> list[HistoryRecord]:
        return self._entries.history(entry, limit)


__all__ = ["RabbitMQStore", "DEFAULT_SLOT_TTL_S"]
