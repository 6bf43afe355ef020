"""The RabbitMQ store (docs/design.md store memory table: RabbitMQ): the broker decides every claim.

URLs ``amqp://user:password@host:5672/vhost`` and ``amqps://...`` go to kombu (py-amqp)
unchanged; the ``ssl`` store option (``True`` or a dict of TLS settings) is kombu's ``ssl``
argument, passed as it is (the options: :mod:`.options`).

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
  values named: a possible miss; docs/design.md "Amnesia").

**Who won** (docs/design.md "Who won"): the winner cannot be read back. Reading the claim message, even
to requeue it, empties the queue for a moment (an unacked message does not count towards
``x-max-length``) and lets a second claim in; a passive declare tells only that *someone*
claimed, not who. So ``recognises_winner`` is False: a nack is ``OTHER_WON`` with ``winner=None``, and
a run whose earlier claim by this process timed out (the answer never came) is ``UNKNOWN`` when
retried and nacked: a possible miss, never a duplicate. Runs acked before such a failure are
answered ``WON`` on the retry (this process heard the ack). Losers cannot learn the winner's
fingerprint, so the rolling-deploy warning of docs/design.md "One run" step 8 does not fire here.

**Memory** (``slot_ttl``, seconds, default 300): the broker deletes a claim queue ``slot_ttl``
after its last *use*; the claim that creates it starts the period, and the later claims do not
extend it (their declares are pipelined with ``nowait``, which RabbitMQ does not count as use;
measured on 3.10), so a run is remembered at least ``slot_ttl`` after its first claim, and a claim
after that wins again. There is no store clock (:meth:`RabbitMQStore.now_ms` is ``None``): the
instances' clocks decide lateness, so **the skew between the fastest and the slowest instance plus
jitter + max_late must stay under slot_ttl** (docs/design.md, the paragraph after the memory table): a
run's window opens at the fastest instance's claim and must still be open at the slowest one's.

**Amnesia** (docs/design.md "Amnesia"): a durable queue ``<prefix>.born.<namespace>.<entry>`` (no
expiry, one message, first writer wins) holds the clock of the instance that began the entry's
memory. It is read once per connection (under the entry's lock, see below) and every claim batch
checks, in the declare pipeline, that it still exists: a broker that lost it (a node reset, a lost
disk, a deleted queue) gets a new one, and slots before its start + 10 s are ``FORGOTTEN``. A
broker restart closes every connection, so no instance keeps a memory start across it. Cost: one
queue per entry and one passive declare per entry per batch (no extra round trip). The start is
on the creating instance's clock, so the skew limit above applies to it too.

**History**: one durable queue per entry, ``x-max-length`` = 4 x ``history_size`` events,
oldest dropped first; writers append events (no read); :meth:`.history.RabbitMQHistory.read`
folds them (one record per run, a later event replaces an earlier one, skip events only fill).
Reading takes every message unacked and gives them back in place, under an exclusive queue
``<prefix>.lock.<namespace>.<entry>`` (held by one connection at a time, freed if it dies), so two
readers never see a half-empty queue; the memory start is read under the same lock. A history
queue declared with another ``history_size`` is kept as it is (a warning). ``store_ms`` of a
record is the recording instance's clock.

Queue names escape namespace and entry (:func:`~celery_anarchon.stores.rabbitmq.connection.escape`)
and hash pairs too long for AMQP's 255 bytes. The AMQP plumbing (names, arguments, confirms, the
session) is in :mod:`~celery_anarchon.stores.rabbitmq.connection`; each entry's memory start and
the lock queues in :mod:`~celery_anarchon.stores.rabbitmq.memory`; the history queues in
:mod:`~celery_anarchon.stores.rabbitmq.history`; the claim queues (the probe, the slot_ttl marker,
the declare and publish phases of a batch) in :mod:`~celery_anarchon.stores.rabbitmq.claims`; the
instance records (heartbeats) in :mod:`~celery_anarchon.stores.rabbitmq.instances`. Queues of entries removed from the schedule stay
(one born and one history queue each, a few bytes).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Sequence

import amqp
import kombu
import kombu.exceptions

from celery_anarchon.errors import ConfigError, StoreUnavailable
from celery_anarchon.stores._common import translated
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimResult, ClaimStore, HistoryRecord, Memory, Outcome, RunEvent,
)
from celery_anarchon.stores.rabbitmq import options as rabbitmq_options
from celery_anarchon.stores.rabbitmq.claims import DECLARE_CHANNELS, ClaimQueues
from celery_anarchon.stores.rabbitmq.connection import QueueNames, Session
from celery_anarchon.stores.rabbitmq.history import RabbitMQHistory
from celery_anarchon.stores.rabbitmq.instances import RabbitMQInstances
from celery_anarchon.stores.rabbitmq.memory import MemoryStarts
from celery_anarchon.stores.rabbitmq.options import DEFAULT_SLOT_TTL_S

logger = logging.getLogger(__name__)



class RabbitMQStore(ClaimStore):
    """RabbitMQ: one classic queue per run decides its claim (see the module docstring). It
    keeps instance records (:mod:`.instances`), but no entries or pauses.

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
        given = rabbitmq_options.parse(url, options)
        super().__init__(url, namespace=namespace, instance_id=instance_id,
                         history_size=given.history_size, claim_timeout=given.claim_timeout)
        self.slot_ttl_s, self.slot_ttl_ms = given.slot_ttl_s, given.slot_ttl_ms
        self.ssl = given.ssl
        self.names = QueueNames(given.queue_prefix, namespace)
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._probed = False
        self._warned: set[str] = set()
        #: the parts, each given what it needs of this store: each entry's memory start and the
        #: lock queues; the history queues; the claim queues (probe, slot_ttl marker, declare,
        #: publish); the instance records
        self._memory = MemoryStarts(
            names=self.names, namespace=self.namespace, instance_id=self.instance_id,
            safe_url=self.safe_url, claim_timeout=self.claim_timeout, drop=self._drop)
        self.history = RabbitMQHistory(
            names=self.names, instance_id=self.instance_id, safe_url=self.safe_url,
            claim_timeout=self.claim_timeout, history_size=self.history_size,
            using=self._using, memory=self._memory, warn_once=self._warn_once)
        self._claims = ClaimQueues(
            names=self.names, memory=self._memory, namespace=self.namespace,
            instance_id=self.instance_id, safe_url=self.safe_url, slot_ttl_s=self.slot_ttl_s,
            slot_ttl_ms=self.slot_ttl_ms, claim_timeout=self.claim_timeout,
            warn_once=self._warn_once)
        #: the instance records (the ``instances`` part)
        self.instances = RabbitMQInstances(
            names=self.names, safe_url=self.safe_url, claim_timeout=self.claim_timeout,
            using=self._using, queue_lock=self._memory.queue_lock)
        #: what this process remembers of unanswered and undelivered claims (the part's; the
        #: test backends forget them with the broker's queues)
        self._uncertain, self._undelivered = self._claims.uncertain, self._claims.undelivered

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
        self._let_go(release=False)

    def _let_go(self, *, release: bool) -> None:
        """Forget the session; ``release`` closes its connection, else its resources are only
        collected (no I/O on a connection that may be broken). Never the parent's, after a fork."""
        session, self._session = self._session, None
        if session is not None and session.pid == os.getpid():
            with contextlib.suppress(Exception):
                (session.conn.release if release else session.conn.collect)()

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
        self._let_go(release=True)

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
                self._claims.probe(s)
                self._probed = True
            error = self._claims.check_settings(s)
            if error:
                raise ConfigError(error)
            for entry in entries:
                warning = self.history.ensure_history(s, entry)
                if warning:
                    warnings.append(warning)
                self._memory.born(s, entry)
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

    # -- claims -------------------------------------------------------------------------------
    def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        """Claim the batch (docs/design.md "One run, in time" step 3): forgotten (before the memory
        start + 10 s), then the broker decides each run: ack WON, nack OTHER_WON (winner unknown), a
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
        with self._using(f"claiming {len(first)} run(s)") as s:
            answers = self._claims.decide(s, first)
            notes = [self._claim_note(first[run], outcome, detail)
                     for run, (outcome, detail) in answers.items()
                     if outcome in (Outcome.WON, Outcome.FORGOTTEN, Outcome.UNKNOWN)]
            try:
                with translated("RabbitMQ", self.safe_url, "recording the batch's history",
                                self.connection_errors, cause=self._cause):
                    self.history.publish_history(s, notes)
            except StoreUnavailable as exc:
                logger.warning("claims decided, but their history was not recorded: %s", exc)
                self._drop()
        return [ClaimResult(request=r, outcome=answers[r.run][0], detail=answers[r.run][1],
                            winner=self.instance_id if answers[r.run][0] is Outcome.WON else None)
                for r in requests]

    def _warn_once(self, message: str, level: int = logging.ERROR) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.log(level, "RabbitMQ store %s: %s", self.safe_url, message)

    def _claim_note(self, request: ClaimRequest, outcome: Outcome, detail: str) -> HistoryRecord:
        event = RunEvent.CLAIMED if outcome is Outcome.WON else RunEvent.for_skip(outcome)
        return HistoryRecord(request.entry, request.slot_ms, event, task_id=request.task_id,
                             detail=detail[:500])


__all__ = ["RabbitMQStore", "DEFAULT_SLOT_TTL_S", "DECLARE_CHANNELS"]
