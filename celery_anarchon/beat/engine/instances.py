"""This instance's heartbeat in an instance store (any store that keeps instance records), and the live instances that run another
definition of a config (``beat_schedule``) entry: a rolling deploy, or a schedule drawn at random
per process. Each instance records, every sync interval, the digest of the fingerprints of the
config entries it runs (the mapping saved once per digest, and again when the
store lost it); one that finds a live instance with
another fingerprint of an entry it runs logs an error naming the entry, both definitions and the
hosts, at start-up and whenever that set of disagreements changes.

A name can also be a store entry and, on some instances, a ``beat_schedule`` entry: those run
their config entry (it wins a name clash, :meth:`EntrySync.merge`), the others run the store's,
so the union of both schedules is sent. An instance sees it through the other instances'
mappings (a store entry it runs that another runs from its beat_schedule; a config entry it runs
under a store entry's name that another does not have in its beat_schedule, so runs the
store's) and logs it once per change of that entry's clash: an error naming the entry, both
definitions, where each comes from, the hosts and the fix (a warning when the two definitions
are the same: the same runs, but a change of the store entry would not reach every instance)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Callable

from celery_anarchon._util import VERSION
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.beat.engine.outage import Outage
from celery_anarchon.beat.engine.skew import SkewCheck
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan, clash_fix
from celery_anarchon.stores.base import ClaimStore
from celery_anarchon.stores.entry_store import InstanceRecord, refused_of

logger = logging.getLogger(__name__)

#: an instance record lives this many sync intervals without a heartbeat
TTL_INTERVALS = 3

#: one disagreement: (entry, the other instance's fingerprint, its host:pid)
Disagreement = tuple[str, str, str]
#: where an instance takes an entry's definition from: the store, or its beat_schedule
FROM_STORE, FROM_CONFIG = "store", "beat_schedule"
#: one clash of a store entry's name with a beat_schedule entry: (entry, where this instance
#: takes it from, the other instance's fingerprint (of the other source), its host:pid)
Clash = tuple[str, str, str, str]


def fingerprints_digest(fingerprints: Mapping[str, str]) -> str:
    """sha256 (hex) of the sorted ``(name, fingerprint)`` pairs: equal for equal mappings."""
    text = json.dumps(sorted(fingerprints.items()), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()



def host_pid() -> str:
    """``host:pid`` of this process, as the log names an instance."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """Writes this instance's record and reports disagreeing instances.

    :param store: a store that keeps instance records (its ``instances`` part).
    :param instance_id: this instance's id.
    :param clock: the wall clock, epoch seconds (start and last tick in the record).
    :param ttl_ms: how long a record lives without a heartbeat (3 sync intervals), ms.
    :param outage: the store outage backoff.
    :param skew: this instance's last skew measurement (in the record).
    :param observer: told how many live instances the store holds, at each heartbeat.
    """

    def __init__(self, store: ClaimStore, instance_id: str, clock: Callable[[], float],
                 ttl_ms: int, outage: Outage, skew: SkewCheck, *,
                 observer: Observer = NOOP) -> None:
        self.store = store
        self.observer = observer
        self.instance_id = instance_id
        self.clock = clock
        self.ttl_ms = ttl_ms
        self.outage = outage
        self.skew = skew
        self.started_ms = int(clock() * 1000)
        self.saved_digest: str | None = None
        self.reported: frozenset[Disagreement] = frozenset()
        self.reported_clashes: frozenset[Clash] = frozenset()
        self._mappings: dict[str, dict[str, str]] = {}       # digest -> its mapping (immutable)
        self._definitions: dict[tuple[str, str], str | None] = {}
        self._mine: tuple[dict, dict[str, str], str] | None = None  # (config, mapping, digest)
        #: the config entries this instance follows at run time from a source every instance
        #: reads on its own, each at its own poll (a database's rows: the Scheduler of
        #: celery_anarchon.contrib.django_celery_beat sets them): a disagreement on one is
        #: reported only once it outlasts ``ttl_ms``, by when every live instance read a change
        self.followed: frozenset[str] = frozenset()
        self._first_seen: dict[Disagreement, int] = {}       # a followed one -> when seen, ms
        #: the entries this instance leaves out because our rules refuse them, by name: the
        #: error of each (a django-celery-beat row the Scheduler on the rows cannot build), in the
        #: record for ``celery anarchon status`` (``InstanceRecord.refused``)
        self.refused: Mapping[str, str] = {}

    def beat(self, config: dict[str, EntryPlan], entries: int,
             store_plans: Mapping[str, EntryPlan] | None = None, *,
             kept: dict | None = None) -> None:
        """Record this instance (``config``: the config plans it runs; ``entries``: how many it
        runs in all; ``kept``: what it keeps from before a loss of the store's entries data,
        ``InstanceRecord.kept``), then compare with the other live instances: the config entries
        they run with other definitions, and the names of ``store_plans`` (the store entries as
        this instance last synced them, those its config shadows included) that some run from the
        store and others from their beat_schedule. A store error is backed off. The fingerprints
        of ``config`` are walked once per ``config`` object (the engine passes a new one when
        beat_schedule changes), not at every heartbeat."""
        if not self.outage.may_try():
            return
        if self._mine is None or self._mine[0] is not config:   # walked once per config
            mapping = {name: plan.fingerprint for name, plan in config.items()}
            self._mine = (config, mapping, fingerprints_digest(mapping))
        _, mine, digest = self._mine
        try:
            live = self.store.instances.instances()
            if not any(record.instance_id == self.instance_id for record in live):
                # this instance's record is gone: the store lost its data (a restart without its
                # disk, a flush) or the record expired (a stall past its ttl); the mapping it
                # named may be gone too, so it is saved again (once: the record is back next time)
                self.saved_digest = None
            if digest != self.saved_digest:
                self.store.instances.save_fingerprints(digest, mine)
                self.saved_digest = digest
            host, pid = socket.gethostname(), os.getpid()
            self.store.instances.record_instance(InstanceRecord(
                self.instance_id, host, pid, VERSION, self.started_ms, int(self.clock() * 1000),
                self.skew.skew_ms, entries, digest, kept=kept,
                refused=refused_of(dict(self.refused))), self.ttl_ms)
            others = self._others(digest, live)
            found = self._settled(self._disagreements(mine, others))
            clashes = self._clashes(mine, store_plans or {}, others)
            if found != self.reported:
                self._report(found, config)
            if clashes != self.reported_clashes:
                self._report_clashes(clashes, config, store_plans or {})
        except StoreError as exc:
            self.outage.failed(exc, "recording this instance in the store")
            return
        self.reported = found
        self.reported_clashes = clashes

    def leave(self) -> None:
        """Drop this instance's record (beat is shutting down); a store error is only logged."""
        try:
            self.store.instances.remove_instance(self.instance_id)
        except StoreError as exc:
            logger.debug("anarchon: removing this instance's record failed: %s", exc)

    def _others(self, digest: str, live: list[InstanceRecord]) -> list[tuple[str, dict[str, str]]]:
        """The other instances of ``live`` (the records read before this one's was written)
        whose config differs from this one's (``digest``), as ``(host:pid, their mapping)``; one
        whose mapping is not saved yet is compared at the next heartbeat."""
        others = []
        live = [record for record in live if record.instance_id != self.instance_id]
        self.observer.live_instances(len(live) + 1)          # this one's record is written
        for other in live:
            if other.fingerprints_digest == digest:
                continue
            theirs = self._mappings.get(other.fingerprints_digest)
            if theirs is None:
                theirs = self.store.instances.load_fingerprints(other.fingerprints_digest)
                if theirs is None:           # not saved yet: compared at the next heartbeat
                    continue
                self._mappings[other.fingerprints_digest] = theirs
            others.append((f"{other.host}:{other.pid}", theirs))
        return others

    @staticmethod
    def _disagreements(mine: dict[str, str],
                       others: list[tuple[str, dict[str, str]]]) -> frozenset[Disagreement]:
        return frozenset((name, fp, who) for who, theirs in others for name, fp in theirs.items()
                         if name in mine and mine[name] != fp)

    def _settled(self, found: frozenset[Disagreement]) -> frozenset[Disagreement]:
        """``found`` without the disagreements on :attr:`followed` entries younger than
        ``ttl_ms`` (instances that have not read a change yet)."""
        if not self.followed:
            self._first_seen = {}
            return found
        now_ms = int(self.clock() * 1000)
        self._first_seen = {d: self._first_seen.get(d, now_ms) for d in found
                            if d[0] in self.followed}
        return frozenset(d for d in found if d[0] not in self.followed
                         or now_ms - self._first_seen[d] >= self.ttl_ms)

    @staticmethod
    def _clashes(mine: dict[str, str], store_plans: Mapping[str, EntryPlan],
                 others: list[tuple[str, dict[str, str]]]) -> frozenset[Clash]:
        """The store entries' names that this instance and another take from different places:
        this one runs the store's and the other its beat_schedule entry, or the reverse (the
        other's beat_schedule lacks a name this one's has: it runs the store's)."""
        if not store_plans:
            return frozenset()
        shadowed_here = [name for name in mine if name in store_plans]
        found = set()
        for who, theirs in others:
            found.update((name, FROM_STORE, fp, who) for name, fp in theirs.items()
                         if name in store_plans and name not in mine)
            found.update((name, FROM_CONFIG, store_plans[name].fingerprint, who)
                         for name in shadowed_here if name not in theirs)
        return frozenset(found)

    def _definition(self, name: str, fingerprint: str) -> str:
        if (name, fingerprint) not in self._definitions:
            self._definitions[(name, fingerprint)] = self.store.history.load_definition(
                name, fingerprint)
        return self._definitions[(name, fingerprint)] or "unknown"

    def _report(self, found: frozenset[Disagreement], config: dict[str, EntryPlan]) -> None:
        if not found:
            logger.warning("anarchon: the live instances agree again on every beat_schedule entry")
            return
        by_entry: dict[str, dict[str, list[str]]] = {}
        for name, fingerprint, host in sorted(found):
            by_entry.setdefault(name, {}).setdefault(fingerprint, []).append(host)
        for name, others in by_entry.items():
            plan = config[name]
            theirs = "; ".join(f"{', '.join(hosts)} run{'s' if len(hosts) == 1 else ''} "
                               f"{fingerprint}: {self._definition(name, fingerprint)}"
                               for fingerprint, hosts in others.items())
            logger.error(
                "anarchon: instances disagree on entry %r: this instance (%s) runs %s: %s; %s. "
                "Where their slots differ, each sends its own runs. Fix: give every instance the "
                "same beat_schedule entry (during a rolling deploy this ends once every host runs "
                "the new code).", name, host_pid(), plan.fingerprint, plan.definition, theirs)

    def _report_clashes(self, found: frozenset[Clash], config: dict[str, EntryPlan],
                        store_plans: Mapping[str, EntryPlan]) -> None:
        """Log each entry whose clash changed: an error naming the entry, both definitions, where
        each comes from, the hosts and the fix (a warning when both definitions are the same);
        an entry whose clash is over, once."""
        new: dict[str, set[Clash]] = {}
        old: dict[str, set[Clash]] = {}
        for clash in found:
            new.setdefault(clash[0], set()).add(clash)
        for clash in self.reported_clashes:
            old.setdefault(clash[0], set()).add(clash)
        for name in sorted(set(old) - set(new)):
            logger.warning("anarchon: entry %r: no live instance runs another definition of it any "
                           "more (the clash of its store entry and a beat_schedule entry is over)",
                           name)
        for name in sorted(n for n in new if new[n] != old.get(n)):
            here = next(iter(new[name]))[1]
            theirs: dict[str, list[str]] = {}
            for _, _, fingerprint, who in sorted(new[name]):
                theirs.setdefault(fingerprint, []).append(who)
            if here == FROM_STORE:
                plan, what = store_plans[name], "a store entry here and a beat_schedule entry"
                mine = f"the store's definition {plan.fingerprint}: {plan.definition}"
                other, text_of = "its beat_schedule", lambda fp: self._definition(name, fp)
            else:
                plan, what = config[name], "a beat_schedule entry here and a store entry"
                mine = (f"its beat_schedule definition {plan.fingerprint}: {plan.definition} "
                        "(the store's is ignored here)")
                other, text_of = "the store's", lambda fp: store_plans[name].definition
            text = "; ".join(f"{', '.join(hosts)} run{'s' if len(hosts) == 1 else ''} {other} "
                             f"definition {fp}: {text_of(fp)}" for fp, hosts in theirs.items())
            differ = any(fp != plan.fingerprint for fp in theirs)
            outcome = ("Each instance sends the slots of the definition it runs: the runs of both "
                       "schedules are sent." if differ else
                       "Both definitions are the same today, but a change of the store entry "
                       "does not reach the instances that run their beat_schedule entry.")
            (logger.error if differ else logger.warning)(
                "anarchon: entry %r is %s on other instances: this instance (%s) runs %s; %s. %s "
                "%s", name, what, host_pid(), mine, text, outcome, clash_fix(name))
