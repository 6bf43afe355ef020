"""This instance's heartbeat in an instance store (any store that keeps instance records), and the live instances that run another
definition of a config (``beat_schedule``) entry: a rolling deploy, or a schedule drawn at random
per process. Each instance records, every sync interval, the digest of the fingerprints of the
config entries it runs (the mapping saved once per digest); one that finds a live instance with
another fingerprint of an entry it runs logs an error naming the entry, both definitions and the
hosts, at start-up and whenever that set of disagreements changes."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Callable

from celery_anarchon.engine.observe import NOOP, Observer
from celery_anarchon.engine.outage import Outage
from celery_anarchon.engine.skew import SkewCheck
from celery_anarchon.errors import StoreError
from celery_anarchon.plan import EntryPlan
from celery_anarchon.stores.entry_store import InstanceRecord, InstanceStore

logger = logging.getLogger(__name__)

#: an instance record lives this many sync intervals without a heartbeat
TTL_INTERVALS = 3

try:
    VERSION = importlib.metadata.version("celery-anarchon")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    VERSION = "unknown"

#: one disagreement: (entry, the other instance's fingerprint, its host:pid)
Disagreement = tuple[str, str, str]


def fingerprints_digest(fingerprints: Mapping[str, str]) -> str:
    """sha256 (hex) of the sorted ``(name, fingerprint)`` pairs: equal for equal mappings."""
    text = json.dumps(sorted(fingerprints.items()), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def host_pid() -> str:
    """``host:pid`` of this process, as the log names an instance."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """Writes this instance's record and reports disagreeing instances.

    :param store: the instance store.
    :param instance_id: this instance's id.
    :param clock: the wall clock, epoch seconds (start and last tick in the record).
    :param ttl_ms: how long a record lives without a heartbeat (3 sync intervals), ms.
    :param outage: the store outage backoff.
    :param skew: this instance's last skew measurement (in the record).
    :param observer: told how many live instances the store holds, at each heartbeat.
    """

    def __init__(self, store: InstanceStore, instance_id: str, clock: Callable[[], float],
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
        self._mappings: dict[str, dict[str, str]] = {}       # digest -> its mapping (immutable)
        self._definitions: dict[tuple[str, str], str | None] = {}
        self._mine: tuple[dict, dict[str, str], str] | None = None  # (config, mapping, digest)

    def beat(self, config: dict[str, EntryPlan], entries: int) -> None:
        """Record this instance (``config``: the config plans it runs; ``entries``: how many it
        runs in all), then compare with the other live instances. A store error is backed off.
        The fingerprints of ``config`` are walked once per ``config`` object (the engine passes a
        new one when beat_schedule changes), not at every heartbeat."""
        if not self.outage.may_try():
            return
        if self._mine is None or self._mine[0] is not config:   # walked once per config
            mapping = {name: plan.fingerprint for name, plan in config.items()}
            self._mine = (config, mapping, fingerprints_digest(mapping))
        _, mine, digest = self._mine
        try:
            if digest != self.saved_digest:
                self.store.save_fingerprints(digest, mine)
                self.saved_digest = digest
            host, pid = socket.gethostname(), os.getpid()
            self.store.record_instance(InstanceRecord(
                self.instance_id, host, pid, VERSION, self.started_ms, int(self.clock() * 1000),
                self.skew.skew_ms, entries, digest), self.ttl_ms)
            found = self._disagreements(mine, digest)
            if found != self.reported:
                self._report(found, config)
        except StoreError as exc:
            self.outage.failed(exc, "recording this instance in the store")
            return
        self.reported = found

    def leave(self) -> None:
        """Drop this instance's record (beat is shutting down); a store error is only logged."""
        try:
            self.store.remove_instance(self.instance_id)
        except StoreError as exc:
            logger.debug("anarchon: removing this instance's record failed: %s", exc)

    def _disagreements(self, mine: dict[str, str], digest: str) -> frozenset[Disagreement]:
        found = set()
        live = self.store.instances()
        self.observer.live_instances(len(live))
        for other in live:
            if other.instance_id == self.instance_id or other.fingerprints_digest == digest:
                continue
            theirs = self._mappings.get(other.fingerprints_digest)
            if theirs is None:
                theirs = self.store.load_fingerprints(other.fingerprints_digest)
                if theirs is None:           # not saved yet: compared at the next heartbeat
                    continue
                self._mappings[other.fingerprints_digest] = theirs
            found.update((name, fp, f"{other.host}:{other.pid}") for name, fp in theirs.items()
                         if name in mine and mine[name] != fp)
        return frozenset(found)

    def _definition(self, name: str, fingerprint: str) -> str:
        if (name, fingerprint) not in self._definitions:
            self._definitions[(name, fingerprint)] = self.store.load_definition(name, fingerprint)
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
