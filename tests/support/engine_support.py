"""Support for the tests of the engine's parts: clocks the test moves, the memory store on the
test's clock (through a thin wrapper that counts calls and injects faults: the store itself is
the real one, so no fake can drift from the contract), plans built without Celery."""
from __future__ import annotations

import collections
import copy as copy_module
import uuid
from datetime import timezone

from celery_anarchon.schedule import slots as slot_math
from celery_anarchon.errors import StoreError
from celery_anarchon.schedule.plan import EntryPlan
from celery_anarchon.stores.base import (
    ClaimRequest, ClaimStore, HistoryRecord, LeasedRun, LeaseTerms, Memory, RunState,
)
from celery_anarchon.stores.entry_store import Pause
from celery_anarchon.stores.memory import MemoryStore
from celery_anarchon.stores.run_now import SlotWindow
from celery_anarchon.schedule.timing import EntryTiming, LeaseSettings

import backends
from helpers import prepared

#: a wall-clock origin on a 10 s slot boundary (epoch seconds)
T0 = 1_700_000_000.0
T0_MS = int(T0 * 1000)


class FakeClock:
    """A clock that moves only when told (``advance``, or ``now = ...``)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, by: float) -> None:
        self.now += by


class StoreClock(FakeClock):
    """The store's clock, UTC ms (integers), moved only when told."""

    def __call__(self) -> int:
        return round(self.now)


class Clocks:
    """The engine's two clocks, ``wall`` (epoch seconds) and ``mono`` (any origin), and the
    store's (``store``, UTC ms: the server's, which a jump of the instance's wall clock leaves
    alone)."""

    def __init__(self, wall: float = T0, mono: float = 1000.0) -> None:
        self.wall = FakeClock(wall)
        self.mono = FakeClock(mono)
        self.store = StoreClock(wall * 1000)

    def advance(self, seconds: float) -> None:
        """Time passes: every clock moves."""
        self.wall.advance(seconds)
        self.mono.advance(seconds)
        self.store.advance(seconds * 1000)


#: the operations of the store contract a :class:`FaultyStore` counts and can make fail: the
#: store's own, and those of its parts (``store.history``, ``store.leases``, ``store.instances``,
#: ``store.entries``)
OPERATIONS = ("prepare", "now_ms", "claim")
PART_OPERATIONS = {
    "history": ("record_many", "read", "read_many", "save_definitions", "load_definition"),
    "leases": ("inspect", "expired_runs", "take_over", "adopt", "renew", "release", "requeue"),
    "instances": ("record_instance", "instances", "remove_instance", "save_fingerprints",
                  "load_fingerprints"),
    "entries": ("entries_version", "entries_epoch", "load_entries", "accept_loss", "put_entry",
                "remove_entry", "set_pause", "request_clock", "find_request", "request_run"),
}


class FaultyStore(MemoryStore):
    """The memory store through a thin wrapper around each operation of :data:`OPERATIONS`:
    it counts and keeps the call (``calls``, :meth:`calls_of`), then raises ``fail`` when set
    (the store unreachable) or an error given to :meth:`fail_next`, else lets the store do it
    (:attr:`recorded`) and, after :meth:`lose_reply`, raises as an answer lost on its way back.

    ``memory`` may be set, standing for a store whose memory is limited by count (Redis
    ``idmp``, ``script``); ``no_clock=True`` stands for a store without a clock (RabbitMQ,
    NATS): :meth:`now_ms` answers ``None``. The store decides with its own clock all the same.
    """

    def __init__(self, *args, no_clock: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: collections.Counter = collections.Counter()
        self.fail: Exception | None = None
        self.no_clock = no_clock
        self._log: list[tuple[str, tuple, bool]] = []     # (operation, arguments, done)
        self._faults: dict[str, list[Exception]] = collections.defaultdict(list)
        self._lost: dict[str, list[Exception]] = collections.defaultdict(list)
        self._memory: Memory | None = None
        parts = {id(part): FaultyPart(self, part)       # entries and instances: one object
                 for part in (self.history, self.leases, self.instances, self.entries)}
        self.history, self.leases, self.instances, self.entries = (
            parts[id(self.history)], parts[id(self.leases)], parts[id(self.instances)],
            parts[id(self.entries)])

    @property
    def memory(self) -> Memory:
        return self._memory or super().memory

    @memory.setter
    def memory(self, value: Memory) -> None:
        self._memory = value

    def fail_next(self, operation: str, *errors: Exception) -> None:
        """The next calls of ``operation`` raise ``errors``, one each, before the store sees them."""
        self._faults[operation].extend(errors)

    def lose_reply(self, operation: str, error: Exception | None = None) -> None:
        """The next call of ``operation`` is done by the store, then raises ``error`` (default
        a StoreError): its answer never came back."""
        self._lost[operation].append(error or StoreError(f"{operation}: the reply was lost"))

    def calls_of(self, operation: str) -> list[tuple]:
        """The positional arguments of each call of ``operation``, in order."""
        return [args for name, args, _ in self._log if name == operation]

    @property
    def recorded(self) -> list:
        """Every history note the store wrote through ``record_many``, in order."""
        return [note for name, (notes,), done in self._log if name == "record_many" and done
                for note in notes]

    def held(self):
        """What the store holds for the namespace (:class:`celery_anarchon.stores.memory.state.Space`)."""
        return backends.memory_server(self.url).space(self.namespace)


class FaultyPart:
    """A part of a :class:`FaultyStore` (``history``, ``leases``, ``instances``, ``entries``)
    through the same wrapper: each operation of :data:`PART_OPERATIONS` counted in the store's
    ``calls``, with the store's faults; everything else is the part's own. A history's
    ``record`` and ``save_definition`` go through the wrapped ``record_many`` and
    ``save_definitions``, as the memory store's do."""

    def __init__(self, store: FaultyStore, part) -> None:
        self.store, self.part = store, part

    def __getattr__(self, name: str):
        return getattr(self.part, name)

    def record(self, entry, slot_ms, event, **fields) -> None:
        self.record_many([HistoryRecord(entry, slot_ms, event, **fields)])

    def save_definition(self, entry, fingerprint, text) -> None:
        self.save_definitions([(entry, fingerprint, text)])


def _wrapped(name: str, *, of_part: bool = False):
    def operation(self, *args, **kwargs):
        store = self.store if of_part else self
        store.calls[name] += 1
        index = len(store._log)
        store._log.append((name, args, False))
        if store.fail is not None:
            raise store.fail
        if store._faults[name]:
            raise store._faults[name].pop(0)
        if name == "now_ms" and store.no_clock:
            result = None
        elif of_part:
            result = getattr(self.part, name)(*args, **kwargs)
        else:
            result = getattr(super(FaultyStore, self), name)(*args, **kwargs)
        store._log[index] = (name, args, True)
        if store._lost[name]:
            raise store._lost[name].pop(0)
        return result
    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = f"The store's ``{name}``, counted, with the faults asked for."
    return operation


for _name in OPERATIONS:
    setattr(FaultyStore, _name, _wrapped(_name))
for _name in {n for names in PART_OPERATIONS.values() for n in names}:
    setattr(FaultyPart, _name, _wrapped(_name, of_part=True))


def memory_store(clocks: Clocks | None = None, *, instance_id: str = "A", namespace: str = "ns",
                 store_clock=None, **options) -> FaultyStore:
    """A :class:`FaultyStore` of its own (a memory server named for it) on the store clock of
    ``clocks`` (or ``store_clock``, a callable returning UTC ms)."""
    clock = store_clock or (clocks or Clocks()).store
    return FaultyStore("memory://engine-" + uuid.uuid4().hex[:12], namespace=namespace,
                       instance_id=instance_id, clock=clock, **options)


def another(store: MemoryStore, instance_id: str) -> MemoryStore:
    """Another instance on ``store``'s server and namespace (a beat, a worker), not wrapped."""
    return MemoryStore(store.url, namespace=store.namespace, instance_id=instance_id,
                       clock=store.clock)


class ThirdPartyStore(MemoryStore):
    """A store another package provides, named by ``anarchon_store_url`` as
    ``"engine_support:ThirdPartyStore"``: the memory store of the server named by the option
    ``server``, built from that value as its URL."""

    kind = "third-party"

    def __init__(self, url: str, *, server: str = "third-party", **kwargs) -> None:
        super().__init__("memory://" + server, **kwargs)
        self.url = url


def not_a_store(url: str, **options) -> dict:
    """A factory named by ``anarchon_store_url`` that builds something other than a store."""
    return {"url": url, **options}


class ClaimsOnly(ClaimStore):
    """The memory store seen through the claim contract alone (no instance records, entries or
    leases), as a store that keeps nothing else would be; ``calls`` are the wrapped store's."""

    kind = "memory"

    def __init__(self, store: FaultyStore) -> None:
        super().__init__(store.url, namespace=store.namespace, instance_id=store.instance_id,
                         history_size=store.history_size)
        self.store = store
        self.calls = store.calls
        self.history = store.history

    @property
    def memory(self) -> Memory:
        return self.store.memory

    def prepare(self, entries):
        return self.store.prepare(entries)

    def close(self) -> None:
        self.store.close()

    def now_ms(self):
        return self.store.now_ms()

    def claim(self, requests):
        return self.store.claim(requests)


def expired_run(store: MemoryStore, clocks: Clocks, entry: str = "e", *,
                state: RunState = RunState.STARTED, attempt: int = 1,
                lease: LeaseSettings | None = None) -> LeasedRun:
    """A leased run of ``entry`` at ``T0`` (the store's clock then) whose runner is presumed dead,
    as the store's lease check returns it: claimed by instance "B", taken over by it until
    ``attempt``, adopted by a worker "runner" when ``state`` is STARTED, then every clock moved
    past its lease or queue deadline. The store is in service for a while first (its memory
    start backdated)."""
    lease = lease or LeaseSettings(duration_s=6, heartbeat_s=1, queue_timeout_s=4, max_attempts=3)
    queue_ms, duration_ms = int(lease.queue_timeout_s * 1000), int(lease.duration_s * 1000)
    beat = prepared(another(store, "B"), entry)
    clocks.store.now = T0_MS
    terms = LeaseTerms(queue_timeout_ms=queue_ms)
    beat.claim([ClaimRequest(entry, T0_MS, max_late_ms=5_000, task_id="t-1", lease=terms)])
    for _ in range(attempt - 1):
        clocks.advance(lease.queue_timeout_s + 0.001)
        (run,) = beat.leases.expired_runs([entry])
        beat.leases.take_over(entry, T0_MS, run.token, queue_timeout_ms=queue_ms, max_attempts=attempt)
    if state is RunState.STARTED:
        another(store, "runner").leases.adopt(entry, T0_MS, "runner", duration_ms)
    clocks.advance((duration_ms if state is RunState.STARTED else queue_ms) / 1000 + 0.001)
    (run,) = beat.leases.expired_runs([entry])
    assert (run.state, run.attempt) == (state, attempt), run
    return run


class Operator:
    """Writes into an entry store as an operator does (``celery_anarchon.schedules(app)``), a
    client of its own on the store's server and namespace (its calls are not the instance's),
    each write 1 ms after the one before on the store's clock (a real store's writes come one
    after another: the times of their records tell them apart)."""

    def __init__(self, store: MemoryStore, clock: StoreClock) -> None:
        self.store, self.clock = another(store, "operator"), clock

    def _tick(self) -> None:
        self.clock.advance(1)

    def put(self, name: str, definition: str | None, pause: Pause | None = None,
            by: str = "t") -> None:
        """The name's definition (added or updated; ``None``: removed) and then its pause, if
        given (``definition`` None and a pause: a pause of a config entry)."""
        held = self.store.entries.load_entries().entries.get(name)
        defined = held is not None and held.definition is not None
        self._tick()
        if definition is not None:
            self.store.entries.put_entry(name, definition, by=by, create=not defined)
        elif defined:
            self.store.entries.remove_entry(name, by=by)
        if pause is not None:
            self.pause(name, pause, by=by)

    def remove(self, name: str, by: str = "t") -> None:
        self._tick()
        self.store.entries.remove_entry(name, by=by)

    def pause(self, name: str, pause: Pause | None, by: str = "t") -> None:
        """Pause or resume (``None``) ``name``."""
        self._tick()
        self.store.entries.set_pause(name, pause, by=by)

    def request(self, entry: str, request_id: str, slot_ms: int) -> None:
        """A run-now request made when the store's clock is ``slot_ms``, so its slot is that
        (the window lists no scheduled slot)."""
        self.clock.now = slot_ms
        window = SlotWindow(slot_ms - SlotWindow.BEFORE_MS, slot_ms + SlotWindow.AFTER_MS)
        made = self.store.entries.request_run(entry, request_id, window, by="t")
        assert made.slot_ms == slot_ms, made

    def accept_loss(self, by: str = "ops") -> None:
        self._tick()
        self.store.entries.accept_loss(by=by)

    def lose_everything(self) -> None:
        """The store forgets every entry, pause and request (a wipe; the server keeps its epoch)."""
        backends.wipe("memory", self.store.url)

    def restart(self) -> None:
        """The server restarts keeping everything: a new server epoch (its next entries write
        writes a new entries epoch)."""
        backends.memory_server(self.store.url).epoch = "memory " + uuid.uuid4().hex[:12]

    def copy(self):
        """A copy of what the store holds for the namespace (for :meth:`put_back`)."""
        return backends.memory_snapshot(self.store.url, self.store.namespace)

    def put_back(self, copy) -> None:
        """The older copy in place of the namespace's data, on the same server (its entries
        epoch the same, its version older)."""
        server = backends.memory_server(self.store.url)
        with server.lock:
            server.spaces[self.store.namespace] = copy_module.deepcopy(copy)


def make_plan(name: str = "e", every_s: float = 10, *, jitter_s: float = 0.0,
              max_late_s: float = 5.0, lease: LeaseSettings | None = None,
              fingerprint: str = "f1") -> EntryPlan:
    """A plan of an interval entry (epoch-aligned slots), without Celery."""
    slots = slot_math.slots_for(every_s, entry=name, app_timezone=timezone.utc)
    timing = EntryTiming(jitter_s=jitter_s, max_late_s=max_late_s, lease=lease)
    return EntryPlan(name, None, slots, timing, {}, fingerprint, f'{{"definition": "{fingerprint}"}}')


def store_plans(snapshot):
    """Store entries -> plans as the scheduler's callback does (here the definition is the
    fingerprint; "bad" stands for a definition that does not parse: left out)."""
    return {name: make_plan(name, fingerprint=stored.definition)
            for name, stored in snapshot.entries.items()
            if stored.definition not in (None, "bad")}
