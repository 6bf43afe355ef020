"""Fakes for the engine's parts: clocks the test moves, a store that answers what the test says,
plans built without Celery."""
from __future__ import annotations

import collections
from datetime import timezone

from celery_anarchon.schedule import slots as slot_math
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import LeasedRun, RunState
from celery_anarchon.stores.base import Memory
from celery_anarchon.stores.entry_store import (
    EntriesEpoch, EntrySnapshot, InstanceRecord, Pause, RunRequest, StoredEntry,
)
from celery_anarchon.schedule.timing import EntryTiming, LeaseSettings

#: a wall-clock origin on a 10 s slot boundary (epoch seconds)
T0 = 1_700_000_000.0


class FakeClock:
    """A clock that moves only when told (``advance``, or ``now = ...``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Clocks:
    """The two clocks the engine takes: ``wall`` (epoch seconds) and ``mono`` (any origin)."""

    def __init__(self, wall: float = T0, mono: float = 1000.0) -> None:
        self.wall = FakeClock(wall)
        self.mono = FakeClock(mono)

    def advance(self, seconds: float) -> None:
        """Time passes: both clocks move."""
        self.wall.advance(seconds)
        self.mono.advance(seconds)


class FakeStore:
    """The store operations the parts use; ``fail`` (an exception) makes every call raise it."""

    safe_url = "fake://store"
    kind = "fake"

    def __init__(self, history_size: int = 100) -> None:
        self.history_size = history_size
        self.fail: Exception | None = None
        self.recorded: list = []
        self.calls: collections.Counter = collections.Counter()
        self.expired: list[LeasedRun] = []
        self.takeover_answers: list = []      # (outcome, run) or an exception, one per call
        self.takeover_calls: list[tuple] = []
        self.takeover_task_ids: list[str] = []
        self.store_ms = None                  # a callable returning the store's clock, or None
        self.definitions: dict[tuple[str, str], str] = {}

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if self.fail is not None:
            raise self.fail

    def record_many(self, notes) -> None:
        self._call("record_many")
        self.recorded.extend(notes)

    def now_ms(self):
        self._call("now_ms")
        return None if self.store_ms is None else self.store_ms()

    def expired_runs(self, entries):
        self._call("expired_runs")
        return [run for run in self.expired if run.entry in entries]

    def take_over(self, entry, slot_ms, token, *, queue_timeout_ms, max_attempts, task_id=""):
        self.takeover_calls.append((entry, slot_ms, token))
        self.takeover_task_ids.append(task_id)
        self._call("take_over")
        answer = self.takeover_answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def save_definition(self, entry, fingerprint, definition) -> None:
        self._call("save_definition")
        self.definitions[(entry, fingerprint)] = definition

    def save_definitions(self, definitions) -> None:
        for entry, fingerprint, definition in definitions:
            self.save_definition(entry, fingerprint, definition)

    def load_definition(self, entry, fingerprint):
        self._call("load_definition")
        return self.definitions.get((entry, fingerprint))


class FakeEntryStore(FakeStore):
    """:class:`FakeStore` with the entry store's operations the sync and heartbeat parts use;
    the test writes entries, pauses and run-now requests with ``put``, ``pause`` and ``request``
    (each raises the entries version, as a store's writes do)."""

    memory = Memory(duration_s=3600.0, count=None, setting="memory")

    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.epoch = "e1"                     # the entries epoch (a test changes it: a loss)
        self.clock_ms = 0                     # the store's clock of the records' updated_ms
        self.accepted_ms = 0
        self.entries: dict[str, StoredEntry] = {}
        self.requests: list[RunRequest] = []
        self.records: dict[str, InstanceRecord] = {}
        self.ttls: dict[str, int] = {}
        self.fingerprints: dict[str, dict[str, str]] = {}

    def put(self, name: str, definition: str | None, pause: Pause | None = None, by: str = "t") -> None:
        self.version += 1
        self.clock_ms += 1
        self.entries[name] = StoredEntry(name, definition, pause, self.version, self.clock_ms, by)

    def remove(self, name: str) -> None:
        self.version += 1
        del self.entries[name]

    def pause(self, name: str, pause: Pause | None, by: str = "t") -> None:
        old = self.entries.get(name)
        self.put(name, old.definition if old else None, pause, by)

    def request(self, entry: str, request_id: str, slot_ms: int) -> None:
        self.version += 1
        self.requests.append(RunRequest(entry, request_id, slot_ms, "t", slot_ms))

    def lose_everything(self, epoch: str = "") -> None:
        """The store forgets every entry, pause and request (a wipe): ``epoch`` is its new one."""
        self.version, self.epoch, self.accepted_ms = 0, epoch, 0
        self.entries.clear()
        self.requests.clear()

    def accept_loss(self, *, by: str) -> int:
        self.version += 1
        self.clock_ms += 1
        self.accepted_ms = self.clock_ms
        return self.clock_ms

    def entries_version(self) -> int:
        self._call("entries_version")
        return self.version

    def entries_epoch(self) -> EntriesEpoch:
        self._call("entries_version")
        return EntriesEpoch(self.epoch, self.version)

    def load_entries(self) -> EntrySnapshot:
        self._call("load_entries")
        return EntrySnapshot(self.version, dict(self.entries), tuple(self.requests),
                             epoch=self.epoch, accepted_ms=self.accepted_ms)

    def record_instance(self, record: InstanceRecord, ttl_ms: int) -> None:
        self._call("record_instance")
        self.records[record.instance_id] = record
        self.ttls[record.instance_id] = ttl_ms

    def instances(self) -> list[InstanceRecord]:
        self._call("instances")
        return list(self.records.values())

    def remove_instance(self, instance_id: str) -> None:
        self._call("remove_instance")
        self.records.pop(instance_id, None)

    def save_fingerprints(self, digest: str, fingerprints) -> None:
        self._call("save_fingerprints")
        self.fingerprints[digest] = dict(fingerprints)

    def load_fingerprints(self, digest: str):
        self._call("load_fingerprints")
        return self.fingerprints.get(digest)


def make_plan(name: str = "e", every_s: float = 10, *, jitter_s: float = 0.0,
              max_late_s: float = 5.0, lease: LeaseSettings | None = None,
              fingerprint: str = "f1") -> EntryPlan:
    """A plan of an interval entry (epoch-aligned slots), without Celery."""
    slots = slot_math.slots_for(every_s, entry=name, app_timezone=timezone.utc)
    timing = EntryTiming(jitter_s=jitter_s, max_late_s=max_late_s, lease=lease)
    return EntryPlan(name, None, slots, timing, {}, fingerprint, f'{{"definition": "{fingerprint}"}}')


def leased_run(entry: str = "e", slot_ms: int = int(T0 * 1000), *, state: RunState = RunState.STARTED,
               attempt: int = 1, token: int = 11, owner: str = "runner") -> LeasedRun:
    """A leased run as the store's lease check returns it (expired)."""
    return LeasedRun(entry, slot_ms, state, attempt, token, owner, lease_expires_ms=slot_ms,
                     queue_deadline_ms=slot_ms, store_ms=slot_ms + 1)
