"""The runtime schedule API (celery_anarchon.schedules(app)) against real stores: what it writes,
what it refuses (with the messages a beat start-up gives), and the errors that name the problem."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import threading

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab

import celery_anarchon
from celery_anarchon import ConfigError, cron
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.errors import EntryExists, EntryOwnedByConfig, UnknownEntry
from celery_anarchon.schedule.plan import build_plan
from celery_anarchon.operate.schedules import ScheduledEntry, Schedules, default_by
from celery_anarchon.schedule.slots import IntervalSlots
from celery_anarchon.stores import open_store
from celery_anarchon.stores.entry_store import ENTRY_STORE_NAMES
from celery_anarchon.stores.run_now import SlotWindow, request_id_ms
from celery_anarchon.settings import Settings

from backends import BACKENDS, kinds_whose_store, url_of
from conftest import require_server
from stores_support import require_client, wait_until

#: the test rows whose store holds entries (read from the classes: a store is built without I/O)
ENTRY_STORES = kinds_whose_store(lambda store: store.entries is not None)


def store_url(kind: str, tmp_path) -> tuple[str, dict]:
    require_client(kind)
    backend = next(b for b in BACKENDS if b.kind == kind)
    if backend.url_variable is None:
        return backend.local_url(str(tmp_path)), {}
    require_server(backend.url, backend.server)
    return backend.url, dict(backend.options)


def make_app(url: str, namespace: str, options: dict | None = None, *, tasks: bool = True, **conf):
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    anarchon_store_options=options or {}, timezone="UTC",
                    beat_schedule={"config-entry": {"task": "proj.report", "schedule": 60.0}},
                    **conf)
    if tasks:
        @app.task(name="proj.report", shared=False)
        def report(*args, **kwargs):
            return None
    return app


@pytest.fixture
def api(tmp_path, namespace):
    app = make_app(f"sqlite:///{tmp_path / 'store.sqlite3'}", namespace)
    with celery_anarchon.schedules(app) as s:
        yield s


@pytest.mark.parametrize("kind", ENTRY_STORES)
def test_a_store_entry_from_add_to_remove(kind, tmp_path, namespace):
    """add, get, list, update, pause, run_now (twice with one id), resume, remove: each written
    once, read back with who did it, and the entries version raised by every write."""
    url, options = store_url(kind, tmp_path)
    app = make_app(url, namespace, options)
    with celery_anarchon.schedules(app, by="ops@test") as s:
        store = s.store
        before = store.entries.entries_version()
        added = s.add("report", task="proj.report", schedule=crontab(minute="*/5"),
                      args=(1, "x"), kwargs={"full": True}, options={"queue": "reports"},
                      anarchon={"max_late": 30})
        assert isinstance(added, ScheduledEntry) and added.source == "store"
        assert added.definition == {"task": "proj.report", "args": [1, "x"], "kwargs": {"full": True},
                                    "options": {"queue": "reports"}, "anarchon": {"max_late": 30},
                                    "schedule": {"crontab": {"minute": "*/5"}}}
        assert added.updated_by == "ops@test" and not added.paused
        assert store.entries.entries_version() > before
        raw = store.entries.load_entries().entries["report"].definition
        assert raw == entry_json.canonical(added.definition)     # canonical JSON text, nothing else
        assert [e.name for e in s.list()] == ["celery.backend_cleanup", "config-entry", "report"]
        assert s.get("config-entry").source == "config"

        v = store.entries.entries_version()
        updated = s.update("report", schedule=cron("0 3 * * *", tz="Europe/Paris"), by="dev@test")
        assert updated.definition["schedule"] == {"cron": "0 3 * * *", "timezone": "Europe/Paris"}
        assert updated.definition["kwargs"] == {"full": True}       # what was not given is kept
        assert updated.updated_by == "dev@test" and updated.version > added.version
        assert store.entries.entries_version() > v

        paused = s.pause("report", reason="migration")
        assert paused.paused and paused.pause.reason == "migration" and paused.pause.by == "ops@test"
        assert s.get("report").pause.describe() == "paused by ops@test: migration"
        with pytest.raises(ConfigError, match="paused by ops@test: migration.*resume it first"):
            s.run_now("report", request_id="r-1")
        assert not s.resume("report").paused
        assert not s.get("report").paused

        first = s.run_now("report", request_id="r-1")
        again = s.run_now("report", request_id="r-1")
        assert first.created and not again.created and first.entry == "report"
        assert again == dataclasses.replace(first, created=False) and first.by == "ops@test"
        assert [r.request_id for r in store.entries.load_entries().requests if r.entry == "report"] == ["r-1"]
        other = s.run_now("report")                       # a new id: a second request, its own slot
        assert other.request_id != "r-1" and other.slot_ms != first.slot_ms and other.created
        # a UUIDv7 of the store's clock (in a new store's first 10 s: up to 10 s ahead)
        made = request_id_ms(other.request_id)
        assert other.requested_ms - 5_000 < made <= other.requested_ms + 10_000, other

        s.remove("report")
        with pytest.raises(UnknownEntry, match="no entry 'report'"):
            s.get("report")
        with pytest.raises(UnknownEntry):
            s.remove("report")
        assert [e.name for e in s.list()] == ["celery.backend_cleanup", "config-entry"]


def test_beat_schedule_entries_are_owned_by_the_config_but_pause_resume_and_run_now(api):
    for call in (lambda: api.add("config-entry", task="proj.report", schedule=5),
                 lambda: api.update("config-entry", schedule=5),
                 lambda: api.remove("config-entry")):
        with pytest.raises(EntryOwnedByConfig, match="'config-entry' is defined in beat_schedule"):
            call()
    assert api.pause("config-entry", reason="quiet hours").paused
    listed = {e.name: e for e in api.list()}
    assert listed["config-entry"].source == "config" and listed["config-entry"].paused
    assert listed["config-entry"].definition["schedule"] == {"every": 60}
    with pytest.raises(ConfigError, match="resume it first"):
        api.run_now("config-entry")
    assert not api.resume("config-entry").paused
    request = api.run_now("config-entry", request_id="once")
    assert request.slot_ms % 60_000 != 0                 # never one of its scheduled slots
    assert api.store.entries.load_entries().requests[-1] == dataclasses.replace(request, created=False)


def test_unknown_entries_and_names_taken(api):
    api.add("report", task="proj.report", schedule=10)
    with pytest.raises(EntryExists, match="'report' exists already"):
        api.add("report", task="proj.report", schedule=20)
    for call in (lambda: api.get("reprot"), lambda: api.update("reprot", schedule=5),
                 lambda: api.remove("reprot"), lambda: api.pause("reprot"),
                 lambda: api.resume("reprot"), lambda: api.run_now("reprot")):
        with pytest.raises(UnknownEntry, match="no entry 'reprot' \\(did you mean 'report'\\?\\)"):
            call()
    with pytest.raises(ConfigError, match="nothing to change"):
        api.update("report")
    assert api.get("report").definition["schedule"] == {"every": 10}


def test_an_update_of_a_crontab_or_cron_without_a_zone_keeps_the_entrys_zone(api):
    """A crontab or cron given to update() without a zone of its own (as an object or as data)
    keeps the entry's zone: the zone is a part of the schedule, which changes only when given.
    A schedule that names a zone sets it; an interval has none."""
    api.add("ny", task="proj.report",
            schedule={"crontab": {"minute": "30", "hour": "9"}, "timezone": "America/New_York"})
    updated = api.update("ny", schedule=crontab(minute=30, hour=10))
    assert updated.definition["schedule"] == {"crontab": {"minute": 30, "hour": 10},
                                              "timezone": "America/New_York"}
    updated = api.update("ny", schedule={"cron": "30 11 * * 1-5"})
    assert updated.definition["schedule"] == {"cron": "30 11 * * 1-5",
                                              "timezone": "America/New_York"}
    updated = api.update("ny", schedule={"crontab": {"hour": "12"}, "timezone": "Asia/Tokyo"})
    assert updated.definition["schedule"] == {"crontab": {"hour": "12"}, "timezone": "Asia/Tokyo"}
    updated = api.update("ny", schedule=cron("0 6 * * *", tz="UTC"))
    assert updated.definition["schedule"] == {"cron": "0 6 * * *", "timezone": "UTC"}
    assert api.update("ny", schedule=60).definition["schedule"] == {"every": 60}
    api.add("plain", task="proj.report", schedule=crontab(minute=0, hour=3))
    updated = api.update("plain", schedule=crontab(minute=0, hour=4))   # no zone to keep
    assert updated.definition["schedule"] == {"crontab": {"minute": 0, "hour": 4}}


def test_an_unsafe_entry_is_refused_with_the_start_up_message_and_nothing_is_written(api):
    app = api.app
    config = ScheduleEntry(name="fast", task="proj.report", schedule=1,
                           options={"anarchon": {"jitter": 0.5}}, app=app)
    with pytest.raises(ConfigError) as at_start_up:
        build_plan("fast", config, app=app, settings=Settings.from_app(app), store=api.store)
    with pytest.raises(ConfigError) as at_add:
        api.add("fast", task="proj.report", schedule=1, anarchon={"jitter": 0.5})
    assert str(at_add.value) == str(at_start_up.value)
    assert "half the shortest gap" in str(at_add.value)
    # a leased entry needs install(app), as at start-up; and an update is checked the same way
    with pytest.raises(ConfigError, match="install\\(app\\) was not called"):
        api.add("leased", task="proj.report", schedule=60, anarchon={"lease": True})
    api.add("slow", task="proj.report", schedule=60)
    with pytest.raises(ConfigError, match="max_late 1 s must be greater than jitter 2 s"):
        api.update("slow", anarchon={"max_late": 1})
    with pytest.raises(ConfigError, match="key 'schedule.crontab.hour'"):
        api.update("slow", schedule={"crontab": {"hour": "24"}})
    assert [e.name for e in api.list()] == ["celery.backend_cleanup", "config-entry", "slow"]
    assert api.get("slow").definition["schedule"] == {"every": 60}


def test_the_memory_rules_are_those_of_the_apps_store(tmp_path, namespace):
    """jitter + max_late must stay within what the store remembers (Redis script: 5 min window)."""
    url, options = store_url("redis-script", tmp_path)
    with celery_anarchon.schedules(make_app(url, namespace, options)) as s:
        with pytest.raises(ConfigError, match="less than the store's memory of a claimed run"):
            s.add("late", task="proj.report", schedule=3600, anarchon={"max_late": 400})
        assert s.add("ok", task="proj.report", schedule=3600, anarchon={"max_late": 200}).name == "ok"
        s.remove("ok")


def test_a_task_no_worker_registered_is_refused_where_that_can_be_known(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    with celery_anarchon.schedules(make_app(url, namespace)) as s:
        with pytest.raises(ConfigError, match="task 'proj.reprot' is not registered in app 'proj' "
                                              "\\(did you mean 'proj.report'\\?\\)"):
            s.add("a", task="proj.reprot", schedule=60)
        assert s.add("a", task="proj.reprot", schedule=60, check_task=False).name == "a"
    # an app that registers no task of its own cannot know the workers' names: not checked
    with celery_anarchon.schedules(make_app(url, namespace, tasks=False)) as s:
        assert s.add("b", task="elsewhere.task", schedule=60).name == "b"


@pytest.mark.parametrize("url", ["amqp://guest:guest@127.0.0.1:5672//", "nats://127.0.0.1:4222"])
def test_a_store_that_cannot_hold_entries_names_the_ones_that_can(url, namespace):
    with pytest.raises(ConfigError) as info:
        celery_anarchon.schedules(make_app(url, namespace))
    assert ENTRY_STORE_NAMES in str(info.value) and "anarchon_store_url" in str(info.value)


def test_schedules_given_as_python_objects_are_stored_as_data(api):
    zoned = crontab(minute="30", hour="2")
    zoned.tz = datetime.timezone.utc                           # a crontab with a zone of its own
    cases = {
        "a": (datetime.timedelta(minutes=2), {"every": 120}),
        "b": (zoned, {"crontab": {"minute": "30", "hour": "2"}, "timezone": "UTC"}),
        "c": (cron("0 22 L * *"), {"cron": "0 22 L * *"}),
        "d": ({"every": 15}, {"every": 15}),
    }
    for name, (sched, data) in cases.items():
        assert api.add(name, task="proj.report", schedule=sched).definition["schedule"] == data
    anchored = api.add("e", task="proj.report", schedule=3600, options={"anarchon": {
        "anchor": datetime.datetime(1970, 1, 1, 0, 15, tzinfo=datetime.timezone.utc)}})
    assert anchored.definition["anarchon"] == {"anchor": 900} and anchored.definition["options"] == {}
    stored = json.loads(api.store.entries.load_entries().entries["e"].definition)
    assert stored["anarchon"] == {"anchor": 900}
    with pytest.raises(ConfigError, match="cannot be stored as data"):
        api.add("f", task="proj.report", schedule=celery_anarchon_custom())


def celery_anarchon_custom():
    class Mine:
        def anarchon_next(self, after):
            return after + datetime.timedelta(seconds=10)

        def anarchon_shortest_gap(self):
            return datetime.timedelta(seconds=10)
    return Mine()


def test_a_run_now_window_lists_the_entrys_scheduled_slots_around_the_stores_clock():
    window = SlotWindow.around(IntervalSlots(1000), 1_796_000_000_500)
    assert (window.start_ms, window.end_ms) == (1_796_000_000_500 - SlotWindow.BEFORE_MS,
                                                1_796_000_000_500 + SlotWindow.AFTER_MS)
    assert window.scheduled == frozenset(range(1_795_999_996_000, 1_796_000_060_001, 1000))
    assert window.choose(1_796_000_001_000, set()) == 1_796_000_001_001
    assert window.choose(1_796_000_001_000, {1_796_000_001_001}) == 1_796_000_001_002
    dense = SlotWindow.around(IntervalSlots(1), 5_000_000)
    assert len(dense.scheduled) == SlotWindow.MAX_SLOTS and dense.end_ms == max(dense.scheduled)
    assert dense.choose(5_000_000, set()) is None


def test_who_made_a_change_defaults_to_user_at_host_and_pid(api):
    import os
    import socket
    assert default_by().endswith(f"@{socket.gethostname()}:{os.getpid()}")
    assert api.add("x", task="proj.report", schedule=60).updated_by == default_by()


def test_a_given_store_is_the_callers_to_close(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = open_store(url, namespace=namespace, instance_id="mine", options={})
    with Schedules(make_app(url, namespace), store=store) as s:
        s.add("x", task="proj.report", schedule=60)
    assert store.entries.load_entries().entries["x"].definition      # still open, still usable
    store.close()


def test_the_entry_celery_beat_adds_itself_can_be_listed_and_paused(api):
    """Beat runs celery.backend_cleanup beside beat_schedule (results expire, the backend does not
    expire them itself): it is a config entry like the others."""
    assert "celery.backend_cleanup" in {e.name for e in api.list()}
    api.pause("celery.backend_cleanup", reason="probe")
    assert api.get("celery.backend_cleanup").pause.reason == "probe"
    with pytest.raises(EntryOwnedByConfig, match="pick another name"):
        api.add("celery.backend_cleanup", task="proj.report", schedule=60)


def test_adding_a_store_entry_under_a_beat_schedule_name_says_to_pick_another(api):
    with pytest.raises(EntryOwnedByConfig, match="'config-entry' is defined in beat_schedule: pick "
                                                 "another name for the store entry"):
        api.add("config-entry", task="proj.report", schedule=60)


def test_entry_names_with_control_characters_or_nothing_visible_are_refused(api):
    for name, words in (("new\nline", "control character '\\n' (U+000A)"),
                        ("tab\there", "control character '\\t'"),
                        ("esc\x1b[31m", "(U+001B)"), ("para\u2029", "(U+2029)"),
                        ("", "not a non-empty string"), ("   ", "empty or whitespace only")):
        with pytest.raises(ConfigError) as info:
            api.add(name, task="proj.report", schedule=10)
        assert words in str(info.value) and "fix:" in str(info.value), (name, info.value)
    assert {e.name for e in api.list()} == {"config-entry", "celery.backend_cleanup"}
    api.add("café ☕ it's \"fine\"", task="proj.report", schedule=10)   # visible: accepted


# -- run-now: one run per request id, one slot per request -------------------------------------

#: a store memory short enough to wait out (seconds), per store whose memory can be that short
SHORT_MEMORY = {"memory": {"memory": 6}, "sqlite": {"memory": 6}, "postgresql": {"memory": 6},
                "redis": {"memory": 6}, "redis-cluster": {"memory": 6},
                "redis-script": {"window": 6}}
#: timing settings that fit that memory (run-now's max_late 2 x 0.2 + 5 s < 6 s)
SHORT_TIMING = dict(anarchon_jitter=0.5, anarchon_max_late=2, anarchon_sync_interval=0.2)


@pytest.mark.parametrize("kind", [k for k in ENTRY_STORES if k in SHORT_MEMORY])
def test_a_request_id_is_one_run_after_the_stores_memory_passed(kind, tmp_path, namespace):
    """The same request id again after the store's memory of claims passed, and after the writes
    that prune (another request; a beat's periodic prune on the SQL stores): the first request,
    its slot and time, never a second one."""
    url, options = store_url(kind, tmp_path)
    memory = SHORT_MEMORY[kind]
    app = make_app(url, namespace, {**options, **memory}, **SHORT_TIMING)
    with celery_anarchon.schedules(app) as s:
        first = s.run_now("config-entry", request_id="ticket-4711")
        memory_ms = 1000 * next(iter(memory.values()))
        wait_until(lambda: s.store.now_ms() > first.requested_ms + memory_ms + 1000, 30,
                   "the store's memory to pass")
        s.run_now("config-entry", request_id="ticket-4712")        # a write that prunes
        if hasattr(s.store, "prune"):
            s.store.prune()                                        # what a beat's claims do
        again = s.run_now("config-entry", request_id="ticket-4711")
        young = s.store.entries.load_entries().requests
    assert again == dataclasses.replace(first, created=False), (first, again)
    assert "ticket-4711" not in [r.request_id for r in young], "beats read only young requests"


@pytest.mark.parametrize("kind, count", [("redis-idmp", "max_size"), ("redis-script", "history_size")])
def test_run_now_is_refused_on_an_entry_whose_count_limited_memory_misses_its_window(
        kind, count, tmp_path, namespace):
    """A store that remembers at most 5 runs per entry, an entry every second: its scheduled
    runs are safe (5 s > jitter + max_late), but a run-now request is claimed up to 2 x
    anarchon_sync_interval + 5 s = 15 s after its slot, when the store may have forgotten the
    first claim (idmp: a second win; script: refused as forgotten). run_now refuses it, naming
    the entry, the values and the fix; nothing is written. The same configuration still passes
    the start-up rules, and run-now works on an entry whose slots are far enough apart."""
    from celery_anarchon.testing import check_schedule
    url, options = store_url(kind, tmp_path)
    app = make_app(url, namespace, {**options, count: 5})
    app.conf.beat_schedule = {
        "fast": {"task": "proj.report", "schedule": 1.0, "options": {"anarchon": {"max_late": 3}}},
        "slow": {"task": "proj.report", "schedule": 60.0}}
    assert check_schedule(app) == [], "beat starts: only run-now is refused"
    with celery_anarchon.schedules(app) as s:
        before = s.store.entries.entries_version()
        with pytest.raises(ConfigError) as info:
            s.run_now("fast", request_id="r-1")
        assert s.store.entries.entries_version() == before and not s.store.entries.load_entries().requests
        assert s.run_now("slow", request_id="r-1").created
    message = str(info.value)
    for fragment in ("entry 'fast'", "run-now refused", "up to 15 s after its slot", "at most 5 runs per entry",
                     f"store option {count!r}", "1 s between slots that is 5 s",
                     f"anarchon_store_options[{count!r}] to at least 32"):
        assert fragment in message, (fragment, message)


def test_a_repeated_request_id_is_answered_with_the_first_request_whatever_happened_since(
        tmp_path, namespace):
    """A retry of a request id is the first request (``created`` False, its slot, time and
    author), never a new run, also when the entry was paused since (not "resume it first": that
    would read as "no request was made"), or removed since (from the store, or from
    beat_schedule: the request was made, and its run is in the history or never comes). A new
    id of a paused or removed entry is refused as before, nothing written."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    app = make_app(url, namespace)
    with celery_anarchon.schedules(app, by="alice") as s:
        s.add("report", task="proj.report", schedule=60)
        first = {name: s.run_now(name, request_id="ticket-4711")
                 for name in ("report", "config-entry")}
        s.pause("report", reason="migration")
        s.pause("config-entry", reason="migration")
        version = s.store.entries.entries_version()
        for name, request in first.items():
            again = s.run_now(name, request_id="ticket-4711", by="bob")
            assert again == dataclasses.replace(request, created=False), (again, request)
            with pytest.raises(ConfigError, match="resume it first"):
                s.run_now(name, request_id="ticket-4712")
        assert s.store.entries.entries_version() == version, "a repeat and a refusal write nothing"
        s.remove("report")
        again = s.run_now("report", request_id="ticket-4711")
        assert again == dataclasses.replace(first["report"], created=False)
        with pytest.raises(UnknownEntry, match="no entry 'report'"):
            s.run_now("report", request_id="ticket-4712")
    gone = make_app(url, namespace)
    gone.conf.beat_schedule = {}
    with celery_anarchon.schedules(gone) as s:
        again = s.run_now("config-entry", request_id="ticket-4711")
        assert again == dataclasses.replace(first["config-entry"], created=False)
        with pytest.raises(UnknownEntry):
            s.run_now("config-entry", request_id="ticket-4712")


def test_run_now_requests_of_one_entry_share_a_count_limited_memory(tmp_path, namespace):
    """idmp with ``max_size=20`` and an entry every second covers a run-now request's 15 s (20 s
    of runs); each request of the entry made within those 15 s takes one of the 20 runs, so
    the sixth request in a row is refused (naming the five, the values and the fix), before
    anything is written; a repeat of a request made before is still its answer."""
    url, options = store_url("redis-idmp", tmp_path)
    app = make_app(url, namespace, {**options, "max_size": 20})
    app.conf.beat_schedule = {"fast": {"task": "proj.report", "schedule": 1.0,
                                       "options": {"anarchon": {"max_late": 3}}}}
    with celery_anarchon.schedules(app) as s:
        made = [s.run_now("fast", request_id=f"r-{i}") for i in range(5)]
        assert all(r.created for r in made)
        before = s.store.entries.entries_version()
        with pytest.raises(ConfigError) as info:
            s.run_now("fast", request_id="r-5")
        assert s.store.entries.entries_version() == before
        assert s.run_now("fast", request_id="r-0") == dataclasses.replace(made[0], created=False)
    message = str(info.value)
    for fragment in ("entry 'fast': run-now refused", "at most 20 runs per entry",
                     "5 other run-now request(s) of the entry made in the last 15 s",
                     "the rest is 15 s", "Fix: wait 15 s and ask again",
                     "anarchon_store_options['max_size'] to at least 42"):
        assert fragment in message, (fragment, message)


#: racers and rounds of the concurrent run-now test
RACERS, ROUNDS = 4, 10


@pytest.mark.parametrize("kind", ENTRY_STORES)
def test_concurrent_run_now_requests_never_share_a_slot(kind, tmp_path, namespace):
    """RACERS callers, each with its own connection, ask run-now of one entry at the same moment,
    ROUNDS times, each with its own request id: every request has a slot of its own (two
    requests on one slot would be one claim: one of them would never run), and the store holds
    every request with the slot its caller was told."""
    url, options = store_url(kind, tmp_path)
    app = make_app(url, namespace, options)
    apis = [celery_anarchon.schedules(app) for _ in range(RACERS)]
    barrier = threading.Barrier(RACERS)
    told: list[list] = [[] for _ in range(RACERS)]

    def racer(i: int) -> None:
        for r in range(ROUNDS):
            barrier.wait(timeout=60)
            told[i].append(apis[i].run_now("config-entry", request_id=f"r{r}-{i}"))
    try:
        for api in apis:
            api.list()                                   # connected and prepared
        threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        requests = [q for qs in told for q in qs]
        assert len(requests) == RACERS * ROUNDS, "every racer finished"
        held = {(q.request_id, q.slot_ms) for q in apis[0].store.entries.load_entries().requests}
    finally:
        for api in apis:
            api.close()
    shared = collections.Counter(q.slot_ms for q in requests)
    assert [slot for slot, n in shared.items() if n > 1] == [], sorted(
        (q.slot_ms, q.request_id) for q in requests if shared[q.slot_ms] > 1)
    assert held == {(q.request_id, q.slot_ms) for q in requests}
    assert all(q.slot_ms % 60_000 for q in requests), "never a scheduled slot"


#: the longest name: 200 characters of 4 bytes each in UTF-8 (800 bytes)
LONGEST_NAME = "\U0001d11e" * 200


@pytest.mark.parametrize("kind", ENTRY_STORES)
def test_one_name_limit_on_every_store_and_a_name_is_one_entry_in_nfc(kind, tmp_path, namespace):
    """The longest name (200 characters, 800 bytes) works on every store: added, paused, its run
    claimed and its history read; one more character is refused before anything is written (on
    PostgreSQL a 2,700-byte name failed as "store unreachable"). "café" typed decomposed (NFD)
    is the composed entry (NFC): added once, paused by either form, listed once."""
    from celery_anarchon.stores.base import ClaimRequest, Outcome
    url, options = store_url(kind, tmp_path)
    app = make_app(url, namespace, options)
    with celery_anarchon.schedules(app) as s:
        assert s.add(LONGEST_NAME, task="proj.report", schedule=60).name == LONGEST_NAME
        assert s.pause(LONGEST_NAME, reason="800 bytes").paused
        assert s.resume(LONGEST_NAME).paused is False
        from backends import backdate_memory_start
        backdate_memory_start(s.store, [LONGEST_NAME], 120_000)
        slot = s.store.now_ms() or int(datetime.datetime.now().timestamp() * 1000)
        [result] = s.store.claim([ClaimRequest(LONGEST_NAME, slot, 120_000, task_id="t-1")])
        assert result.outcome is Outcome.WON, result
        assert [r.slot_ms for r in s.store.history.read(LONGEST_NAME)] == [slot]
        before = s.store.entries.entries_version()
        for name, words in ((LONGEST_NAME + "x", "201 characters, more than 200"),
                            ("pay\u202eroll", "format character U\\+202E"),
                            ("zero\u200bwidth", "format character U\\+200B")):
            with pytest.raises(ConfigError, match=words):
                s.add(name, task="proj.report", schedule=60)
        assert s.store.entries.entries_version() == before, "a refused name was written"

        composed, decomposed = "caf\u00e9", "cafe\u0301"
        assert s.add(decomposed, task="proj.report", schedule=60).name == composed
        with pytest.raises(EntryExists, match="'café'.* already"):
            s.add(composed, task="proj.report", schedule=60)
        assert s.pause(decomposed, reason="either form").name == composed
        assert s.get(composed).paused and s.get(decomposed).paused
        assert [e.name for e in s.list() if e.name.startswith("caf")] == [composed]
        s.update(decomposed, schedule=120)
        assert s.get(composed).definition["schedule"] == {"every": 120}
        s.remove(decomposed)
        assert not [e for e in s.list() if e.name.startswith("caf")]
        s.remove(LONGEST_NAME)


#: the longest request id: 200 characters of 4 bytes each in UTF-8 (800 bytes)
LONGEST_REQUEST_ID = "\U0001d120" * 200


@pytest.mark.parametrize("kind", ENTRY_STORES)
def test_one_request_id_limit_on_every_store_and_an_id_is_one_request_in_nfc(
        kind, tmp_path, namespace):
    """Request ids have the rules of entry names: the longest id (200 characters, 800 bytes) of
    the longest name round-trips on every store (one request, found again, read back by beat);
    one more character, a control or format character, or nothing visible is refused, naming
    the entry, the id (escaped, shortened) and the fix, before anything is written. An id typed
    decomposed (NFD) is the composed one (NFC): one request."""
    url, options = store_url(kind, tmp_path)
    app = make_app(url, namespace, options)
    with celery_anarchon.schedules(app) as s:
        s.add(LONGEST_NAME, task="proj.report", schedule=60)
        first = s.run_now(LONGEST_NAME, request_id=LONGEST_REQUEST_ID)
        again = s.run_now(LONGEST_NAME, request_id=LONGEST_REQUEST_ID)
        assert first.created and again == dataclasses.replace(first, created=False)
        assert [(r.entry, r.request_id) for r in s.store.entries.load_entries().requests] == [
            (LONGEST_NAME, LONGEST_REQUEST_ID)]
        before = s.store.entries.entries_version()
        for request_id, words in (
                (LONGEST_REQUEST_ID + "x", "201 characters, more than 200"),
                ("i" * 5000, "5,000 characters, more than 200"),
                ("t-1\nX-Injected: 1", "control character '\\n' (U+000A)"),
                ("pay\u202eroll", "format character U+202E (RIGHT-TO-LEFT OVERRIDE)"),
                ("zero\u200bwidth", "format character U+200B (ZERO WIDTH SPACE)"),
                ("", "not a non-empty string"), ("   ", "empty or whitespace only"),
                (42, "not a non-empty string")):
            with pytest.raises(ConfigError) as info:
                s.run_now("config-entry", request_id=request_id)
            message = str(info.value)
            assert message.startswith("entry 'config-entry': run-now request id "), message
            assert words in message and "fix:" in message and len(message) < 500, message
        with pytest.raises(ConfigError) as info:
            s.run_now(LONGEST_NAME, request_id="i" * 201)
        assert str(info.value).startswith(f"entry {LONGEST_NAME[:40]!r}...: run-now request id "
                                          f"{'i' * 40!r}...: 201 characters"), info.value
        assert s.store.entries.entries_version() == before, "a refused request id was written"

        composed = s.run_now("config-entry", request_id="caf\u00e9-1")
        decomposed = s.run_now("config-entry", request_id="cafe\u0301-1")
        assert composed.created and decomposed == dataclasses.replace(composed, created=False)
        s.remove(LONGEST_NAME)


def test_a_definition_stored_before_these_rules_can_still_be_removed_by_its_exact_name(api):
    """A name written by an older version (decomposed, or longer than the limit) is not run by
    beat and is shown as a problem; ``remove`` finds it by its exact name, so it can go."""
    entries = api._ready()
    text = entry_json.canonical({"task": "proj.report", "schedule": {"every": 60}})
    for name in ("cafe\u0301", "n" * 300):
        entries.put_entry(name, text, by="older version", create=True)
        api.remove(name)
        left = entries.load_entries().entries.get(name)
        assert left is None or left.cleared, left     # a removal leaves a cleared record


def test_a_beat_schedule_name_is_one_entry_in_nfc_so_a_pause_by_either_form_stops_it(
        tmp_path, namespace):
    """beat_schedule names "café" decomposed (NFD): beat runs it as the composed name (NFC),
    the API pauses it by either form, and beat's claim of its run answers paused."""
    from backends import backdate_memory_start
    from celery_anarchon import Scheduler
    from celery_anarchon.stores.base import ClaimRequest, Outcome
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    app = make_app(f"sqlite:///{tmp_path / 'store.sqlite3'}", namespace)
    app.conf.beat_schedule = {decomposed: {"task": "proj.report", "schedule": 60.0}}
    scheduler = Scheduler(app)
    try:
        assert composed in scheduler.engine.plans and decomposed not in scheduler.engine.plans
        with celery_anarchon.schedules(app) as s:
            assert s.pause(composed, reason="either form").paused
            assert [e.name for e in s.list() if e.name.startswith("caf")] == [composed]
            assert s.get(decomposed).paused
        backdate_memory_start(scheduler.store, [composed], 120_000)
        slot = scheduler.store.now_ms()
        [result] = scheduler.store.claim([ClaimRequest(composed, slot, 60_000, task_id="t")])
        assert result.outcome is Outcome.PAUSED
    finally:
        scheduler.close()


def test_an_update_with_a_bad_value_is_refused_and_writes_nothing(api):
    """Each bad value an add refuses, an update refuses too, with the same message; the entry
    and the store's version stay as they were."""
    api.add("report", task="proj.report", schedule=60, options={"queue": "reports"})
    before, definition = api.store.entries.entries_version(), api.get("report").definition
    deep: list = []
    for _ in range(200):
        deep = [deep]
    for change, words in ((dict(schedule=1e12), "in the year 33658"),
                          (dict(schedule="every 5 minutes"), "is text"),
                          (dict(options={"expires": "soon"}), "options['expires'] = 'soon'"),
                          (dict(options={"headers": "x"}), "options['headers'] = 'x'"),
                          (dict(anarchon={"max_late": 1e308}), "more than 3155760000 s"),
                          (dict(args=deep), "key 'args' is nested more than 100 levels"),
                          (dict(args=["x" * 70_000]), "more than 65,536")):
        with pytest.raises(ConfigError) as info:
            api.update("report", **change)
        assert words in str(info.value) and "fix:" in str(info.value), (change, info.value)
    assert api.store.entries.entries_version() == before and api.get("report").definition == definition
