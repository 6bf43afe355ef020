"""Backfill (celery_anarchon.schedules(app).backfill and `celery anarchon backfill`) on real stores
and a real broker (the sandbox Redis, database 8): each slot of the range is sent once, a repeat
sends nothing, a slot a beat claimed is not sent again, a resumed backfill sends the rest and
never the slots the interrupted one claimed, and every refusal says why, word for word."""
from __future__ import annotations

import collections
import json
import re
import time

import pytest
from celery import Celery

import celery_anarchon
from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError, UnknownEntry
from celery_anarchon.messages import INSTALLED_ATTR
from celery_anarchon.operate.backfill import BackfillReport, BackfillStopped
from celery_anarchon.operate.cli import backfills as cli_backfill
from celery_anarchon.schedule.plan import task_id_for
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimRequest, Outcome, RunEvent

from backends import backdate_memory_start
from broker_reads import BROKER_URL, queued_messages
from conftest import REDIS_URL, require_server
from operate_support import run_in_process
from stores_support import VARIANT_OPTIONS, store_url

#: the entry of these tests: every second
EVERY_S = 1.0


class Stop(Exception):
    """Raised by a progress callback: the backfill stops there, as one killed would."""


def make_app(url: str, namespace: str, options: dict | None = None, **conf) -> Celery:
    """An app on the store ``url`` and the test broker, with the entry ``tick`` (every second)
    and the leased entry ``leased``, its messages in a queue of the namespace's own."""
    app = Celery("proj", set_as_current=False)
    conf.setdefault("broker_url", BROKER_URL)
    app.conf.update(anarchon_store_url=url, anarchon_namespace=namespace,
                    anarchon_store_options=options or {}, timezone="UTC",
                    task_default_queue=f"bf-{namespace}",
                    beat_schedule={"tick": {"task": "proj.tick", "schedule": EVERY_S},
                                   "leased": {"task": "proj.tick", "schedule": 60.0,
                                              "options": {"anarchon": {"lease": True}}}},
                    **conf)
    setattr(app, INSTALLED_ATTR, True)      # as install(app) marks it (leased entries build)
    return app


def sent_slots(namespace: str) -> list[int]:
    """The slots of ``tick`` whose messages wait on the broker (no worker consumes them)."""
    return sorted(h["anarchon_slot"] for h in queued_messages(f"bf-{namespace}")
                  if h.get("anarchon_entry") == "tick")


def opened(kind: str, tmp_path, namespace: str, **options):
    """The app and its store of ``kind``, the memory of ``tick`` backdated 10 minutes (a new
    store refuses the slots before its memory began)."""
    require_server(REDIS_URL, "Redis (the broker)")
    url = store_url(kind, str(tmp_path))
    options = {**VARIANT_OPTIONS.get(kind, {}), **options}
    app = make_app(url, namespace, options)
    store = open_store(url, namespace=namespace, instance_id="test", options=dict(options))
    store.prepare(["tick"])
    backdate_memory_start(store, ["tick"], 600_000)
    return app, store


def interrupted(s, start: int, end: int, *, sends: int, rate: float) -> None:
    """Backfill ``tick`` from ``start`` to ``end`` (request id ``r``) and stop it after ``sends``
    sends, as a process killed there would: the slots its chunk claimed after them are unsent."""
    def stop(report: BackfillReport) -> None:
        if len(report.sent) == sends:
            raise Stop

    with pytest.raises(Stop):
        s.backfill("tick", start, end, request_id="r", rate=rate, progress=stop)


def past_range(seconds: int, ago: int = 5) -> tuple[int, int]:
    """[now - ``seconds`` - ``ago``, now - ``ago``] on whole seconds, UTC ms."""
    end = (int(time.time()) - ago) * 1000
    return end - seconds * 1000, end


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgresql"])
def test_each_slot_of_the_range_is_sent_once_and_a_repeat_sends_nothing(kind, tmp_path, namespace):
    app, store = opened(kind, tmp_path, namespace)
    start, end = past_range(20)
    slots = list(range(start, end + 1, 1000))
    with celery_anarchon.schedules(app, by="ops@test") as s:
        report = s.backfill("tick", start, end, request_id="t-1", rate=1000)
        assert report.sent == slots and report.total == 21
        assert (report.already_run, report.not_resent, report.refused) == ([], [], {})
        assert sent_slots(namespace) == slots
        headers = {h["anarchon_slot"]: h for h in queued_messages(f"bf-{namespace}")}
        first = headers[start]
        assert first["id"] == task_id_for(namespace, "tick", start, 1)
        assert first["anarchon_instance"] == report.instance
        assert re.fullmatch(r"backfill:t-1:[^:]+:\d+:[0-9a-f]{8}", report.instance)
        assert (first["anarchon_namespace"], first["anarchon_attempt"],
                first["celery_beat_task"]) == (namespace, 1, True)
        runs = {r.slot_ms: r for r in store.history.read("tick")}
        assert {runs[s].event for s in slots} == {RunEvent.SENT}
        assert runs[start].detail == "backfill t-1 by ops@test"
        assert runs[start].instance == report.instance
        assert runs[start].task_id == first["id"]

        again = s.backfill("tick", start - 3000, end, request_id="t-1", rate=1000)
        assert again.instance != report.instance            # never the same instance id
        assert again.sent == [start - 3000, start - 2000, start - 1000]
        assert again.already_run == slots and again.not_resent == []
        assert again.summary().startswith(
            f"backfill t-1 of entry 'tick', {iso(start - 3000)} to {iso(end)}: 24 slots; sent 3, "
            "already run 21, refused 0, not re-sent 0")
    counts = collections.Counter(sent_slots(namespace))
    assert len(counts) == 24 and set(counts.values()) == {1}
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_slot_a_beat_claimed_is_not_sent_again(kind, tmp_path, namespace):
    app, store = opened(kind, tmp_path, namespace)
    start, end = past_range(10, ago=2)
    beat = open_store(store.url, namespace=namespace, instance_id="beat-host:4242:abcdef",
                      options=dict(VARIANT_OPTIONS.get(kind, {})))
    now = int(time.time() * 1000)
    beaten = [start + 2000, end]
    won = beat.claim([ClaimRequest("tick", s, max_late_ms=now - s + 60_000) for s in beaten])
    assert [r.outcome for r in won] == [Outcome.WON, Outcome.WON]
    with celery_anarchon.schedules(app) as s:
        report = s.backfill("tick", start, end, rate=1000)
    assert report.already_run == beaten
    assert report.sent == [x for x in range(start, end + 1, 1000) if x not in beaten]
    assert sent_slots(namespace) == report.sent
    beat.close()
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_resumed_backfill_sends_the_rest_and_never_what_the_interrupted_one_claimed(
        kind, tmp_path, namespace):
    """The first backfill claims 5 slots a chunk (rate 5) and stops after 3 sends: 2 slots are
    claimed and not sent (a process killed between its claim and its send). The same backfill
    again sends every other slot, reports those 2 as not re-sent and sends none twice."""
    app, store = opened(kind, tmp_path, namespace)
    start, end = past_range(11)
    slots = list(range(start, end + 1, 1000))

    with celery_anarchon.schedules(app, by="ops@test") as s:
        interrupted(s, start, end, sends=3, rate=5)
        assert sent_slots(namespace) == slots[:3]
        runs = {r.slot_ms: r.event for r in store.history.read("tick")}
        assert [runs.get(x) for x in slots[:6]] == [RunEvent.SENT] * 3 + [RunEvent.CLAIMED] * 2 + [None]

        told = []
        report = s.backfill("tick", start, end, request_id="r", rate=1000,
                            progress=lambda r: told.append(r.done))
    assert report.already_run == slots[:3] and report.not_resent == slots[3:5]
    assert report.sent == slots[5:] and report.resumed == 5
    assert told == list(range(1, 13))
    assert report.summary().splitlines()[1:] == [
        f"  not re-sent 2 ({iso(slots[3])}, {iso(slots[4])}): claimed by an earlier backfill, "
        "history shows no send: not re-sent (it was interrupted between its claim and its send, "
        "or it is still running and sends it)"]
    assert sent_slots(namespace) == slots[:3] + slots[5:]
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_resumed_backfill_tells_slots_past_the_history_apart_from_slots_not_sent(
        kind, tmp_path, namespace):
    """The history keeps the entry's newest 3 runs: of the 6 slots the first backfill sent (it
    claimed all 8 and stopped before the last 2 sends), 5 are gone from it at once. Resumed, the
    backfill reports those 5 as past the history (not as unsent), the one it still holds as
    already run, the 2 claimed and not sent as not re-sent, and sends none of them."""
    app, store = opened(kind, tmp_path, namespace, history_size=3)
    start, end = past_range(7)
    slots = list(range(start, end + 1, 1000))

    with celery_anarchon.schedules(app, by="ops@test") as s:
        interrupted(s, start, end, sends=6, rate=1000)
        assert sent_slots(namespace) == slots[:6]
        assert sorted(r.slot_ms for r in store.history.read("tick")) == slots[5:]
        report = s.backfill("tick", start, end, request_id="r", rate=1000)
    assert (report.past_history, report.already_run, report.not_resent, report.sent) == (
        slots[:5], slots[5:6], slots[6:], [])
    assert report.done == 8
    lines = report.summary().splitlines()
    assert lines[0].endswith("8 slots; sent 0, already run 1, refused 0, not re-sent 2, past the "
                             "history 5")
    assert lines[2] == (
        f"  past the history 5 ({iso(slots[0])}, {iso(slots[1])}, {iso(slots[2])}, ... 2 more): "
        "claimed by an earlier backfill, older than every run the history still holds (it keeps "
        "the entry's newest 3 runs): whether that backfill sent them is not known here (it sends "
        "each slot right after its claim, so most likely it did); not re-sent")
    assert report.as_json()["past_history"] == [iso(x) for x in slots[:5]]
    assert sent_slots(namespace) == slots[:6]
    store.close()


def test_a_store_entry_is_backfilled_with_its_own_arguments_and_options(tmp_path, namespace):
    app, store = opened("sqlite", tmp_path, namespace)
    store.prepare(["dyn"])
    backdate_memory_start(store, ["dyn"], 600_000)
    start, end = past_range(2)
    with celery_anarchon.schedules(app) as s:
        s.add("dyn", task="proj.tick", schedule=1.0, kwargs={"full": True},
              options={"priority": 3}, check_task=False)
        report = s.backfill("dyn", start, end, rate=1000)
    assert report.sent == [start, start + 1000, end]
    messages = [h for h in queued_messages(f"bf-{namespace}") if h.get("anarchon_entry") == "dyn"]
    assert sorted(h["anarchon_slot"] for h in messages) == report.sent
    assert {h["kwargsrepr"] for h in messages} == {"{'full': True}"}
    store.close()


def test_a_publish_that_fails_stops_the_backfill_and_its_claimed_slots_are_never_resent(
        tmp_path, namespace):
    """A broker nobody listens on: the first publish fails; that slot is recorded send_unknown,
    the others the chunk claimed send_failed, and the backfill stops saying so. Run again with
    the broker back, it sends none of them (each may or may not have reached the broker)."""
    app, store = opened("sqlite", tmp_path, namespace)
    start, end = past_range(2)
    slots = [start, start + 1000, end]
    down = make_app(store.url, namespace, broker_url="redis://127.0.0.1:1/0",
                    broker_connection_timeout=1, broker_connection_retry=False)
    with celery_anarchon.schedules(down, by="ops@test") as s:
        with pytest.raises(BackfillStopped) as caught:
            s.backfill("tick", start, end, request_id="down", rate=1000)
    message = str(caught.value)
    assert message.startswith(f"backfill down of entry 'tick' stopped: the publish of slot "
                              f"{iso(start)} failed (")
    assert message.endswith("); 2 more slots it claimed are not sent; fix the broker and run it "
                            "again (what was claimed is not sent twice)")
    assert caught.value.report.failed == [start] and caught.value.report.sent == []
    runs = {r.slot_ms: r for r in store.history.read("tick")}
    assert [runs[x].event for x in slots] == [RunEvent.SEND_UNKNOWN, RunEvent.SEND_FAILED,
                                              RunEvent.SEND_FAILED]
    assert runs[end].detail == "backfill down by ops@test: stopped before its send"
    with celery_anarchon.schedules(app) as s:
        report = s.backfill("tick", start, end, request_id="down", rate=1000)
    assert report.sent == [] and report.not_resent == slots
    assert sent_slots(namespace) == []
    store.close()


def test_slots_before_the_stores_memory_began_are_refused_by_the_store(tmp_path, namespace):
    """A store that began remembering the entry just now cannot vouch for its older slots: each
    is refused as forgotten, with the store's words, and nothing is sent."""
    require_server(REDIS_URL, "Redis (the broker)")
    app = make_app(store_url("sqlite", str(tmp_path)), namespace)
    start, end = past_range(3, ago=30)
    with celery_anarchon.schedules(app) as s:
        report = s.backfill("tick", start, end, rate=1000)
    assert report.sent == [] and list(report.refused.values()) == [list(range(start, end + 1, 1000))]
    (reason,) = report.refused
    assert re.fullmatch(r"forgotten: store memory began at \S+; slots before \S+ are refused",
                        reason), reason
    assert sent_slots(namespace) == []


def _refused(call, pattern: str) -> None:
    """``call`` raises a ConfigError whose whole message is ``pattern`` (``{T}``: an instant)."""
    with pytest.raises(ConfigError) as caught:
        call()
    regex = re.escape(pattern).replace(re.escape("{T}"), r"\S+")
    assert re.fullmatch(regex, str(caught.value)), str(caught.value)


def test_every_refusal_names_the_entry_the_value_and_the_fix(tmp_path, namespace):
    app, store = opened("sqlite", tmp_path, namespace, memory=300)
    start, end = past_range(10)
    with celery_anarchon.schedules(app) as s:
        with pytest.raises(UnknownEntry) as caught:
            s.backfill("tock", start, end)
        assert str(caught.value).startswith("no entry 'tock' (did you mean 'tick'?)")
        _refused(lambda: s.backfill("tick", end, start),
                 f"backfill of entry 'tick': start {iso(end)} is after end {iso(start)}; fix: give "
                 "a start before the end")
        future = end + 3_600_000
        _refused(lambda: s.backfill("tick", start, future),
                 f"backfill of entry 'tick': end {iso(future)} is in the future (now {{T}}): a "
                 "backfill runs past slots only; fix: give an end before now (the schedule runs "
                 "the slots to come)")
        old = end - 290_000
        _refused(lambda: s.backfill("tick", old, end),
                 f"backfill of entry 'tick': the store remembers claims for 300 s; a backfill from "
                 f"{iso(old)} could send a slot twice; shorten the range (from {{T}} at the "
                 "earliest) or raise anarchon_store_options['memory']")
        _refused(lambda: s.backfill("tick", start, end, max_slots=5),
                 f"backfill of entry 'tick': more than 5 slots between {iso(start)} and "
                 f"{iso(end)}; fix: shorten the range, or raise the bound (max_slots=, "
                 "--max-slots) if that many runs are meant")
        _refused(lambda: s.backfill("leased", start, end),
                 "backfill of entry 'leased': the entry is leased; a backfill does not hold "
                 "leases (its runs would not be adopted, renewed or taken over); fix: backfill an "
                 "entry without a lease, or ask for single runs with run-now")
        _refused(lambda: s.backfill("tick", start, end, request_id="a b"),
                 "backfill of entry 'tick': request id 'a b': not 1 to 100 letters, digits or "
                 ". _ @ + -; fix: give an id such as 'ticket-4711', or none (a new one is made and "
                 "printed)")
        _refused(lambda: s.backfill("tick", "2026-03-01T09:00:00", end),
                 "backfill of entry 'tick': start '2026-03-01T09:00:00': no UTC offset (a naive "
                 "time would be read in each host's own zone); fix: give the offset, e.g. "
                 "'2026-03-01T09:00:00+01:00' or datetime(2026, 3, 1, 8, tzinfo=timezone.utc)")
        s.pause("tick", reason="migration", by="ops@test")
        _refused(lambda: s.backfill("tick", start, end),
                 "backfill of entry 'tick': the entry is paused by ops@test: migration: every "
                 "claim would answer paused; fix: resume it first (celery anarchon resume tick)")
    assert sent_slots(namespace) == []
    store.close()


def test_a_store_whose_claims_only_move_forward_or_remember_too_few_runs_is_refused(
        tmp_path, namespace):
    start, end = past_range(30)
    app, store = opened("redis-stream-id", tmp_path, namespace)
    with celery_anarchon.schedules(app) as s:
        _refused(lambda: s.backfill("tick", start, end),
                 "backfill of entry 'tick': the store (redis strategy=stream-id memory=forever) "
                 "claims slots in order only (an older slot is refused once a newer one was claimed), so it "
                 "cannot backfill; fix: use the Redis strategy 'lease' (the default), PostgreSQL "
                 "or SQLite as anarchon_store_url")
    store.close()
    app, store = opened("redis-script", tmp_path, namespace, history_size=125)
    start, end = past_range(200)          # within its window of 300 s, beyond its 125 runs
    with celery_anarchon.schedules(app) as s:
        _refused(lambda: s.backfill("tick", start, end),
                 "backfill of entry 'tick': the store remembers at most 125 runs of an entry, and "
                 f"more than that lie between {iso(start)} and now: a backfill from there could "
                 "send a slot twice; shorten the range or raise "
                 "anarchon_store_options['history_size']")
    store.close()
    assert sent_slots(namespace) == []


def test_the_command_confirms_shows_progress_and_resumes(tmp_path, namespace, capsys):
    app, store = opened("sqlite", tmp_path, namespace)
    start, end = past_range(4)
    frm, to = iso(start), iso(end)
    code, out, err = run_in_process(cli_backfill.backfill, app, "tick", start=frm, end=to,
                                    request_id="cli-1", rate=1000.0, max_slots=10_000, by="ops@test",
                                    yes=False, as_json=False, capsys=capsys)
    assert code == 2 and err == ("Error: no terminal to confirm on; fix: give --yes to run the "
                                 "backfill\n")
    assert sent_slots(namespace) == []
    code, out, err = run_in_process(cli_backfill.backfill, app, "tick", start=frm, end=to,
                                    request_id="cli-1", rate=1000.0, max_slots=10_000,
                                    by="ops@test", yes=True, as_json=False, capsys=capsys)
    assert code == 0, err
    assert out.splitlines() == [
        f"backfill cli-1 of entry 'tick': 5 slots from {frm} to {to}, at most 1000 a second; "
        "each is claimed like a run and sent only if no beat or other backfill sent it",
        "to resume it if it is interrupted (what it claimed is never sent twice): celery "
        f"anarchon backfill tick --from {frm} --to {to} --request-id cli-1 --yes",
        "backfill cli-1: 5/5 slots, sent 5",
        f"backfill cli-1 of entry 'tick', {frm} to {to}: 5 slots; sent 5, already run 0, "
        "refused 0, not re-sent 0"]
    code, out, err = run_in_process(cli_backfill.backfill, app, "tick", start=frm, end=to,
                                    request_id="cli-1", rate=1000.0, max_slots=10_000,
                                    by="ops@test", yes=True, as_json=False, capsys=capsys)
    assert code == 0 and out.splitlines()[-2:] == [
        f"backfill cli-1 of entry 'tick', {frm} to {to}: 5 slots; sent 0, already run 5, "
        "refused 0, not re-sent 0",
        "resumed: 5 slots were claimed by an earlier backfill, or by one running now (not sent "
        "again by this one)"]
    code, out, err = run_in_process(cli_backfill.backfill, app, "tick", start=frm, end=to,
                                    request_id="cli-2", rate=1000.0, max_slots=10_000,
                                    by="ops@test", yes=True, as_json=True, capsys=capsys)
    answer = json.loads(out)
    assert code == 0 and answer["already_run"] == [iso(x) for x in range(start, end + 1, 1000)]
    assert answer["request_id"] == "cli-2" and answer["sent"] == [] and answer["slots"] == 5
    assert err.splitlines()[0].startswith("backfill cli-2 of entry 'tick': 5 slots from ")
    code, out, err = run_in_process(cli_backfill.backfill, app, "tick", start="1h", end=None,
                                    request_id=None, rate=10.0, max_slots=10_000, by=None,
                                    yes=True, as_json=False, capsys=capsys)
    assert code == 2 and err.startswith(
        "Error: backfill of entry 'tick': the store remembers claims for 3600 s; a backfill from ")
    assert sent_slots(namespace) == list(range(start, end + 1, 1000))
    store.close()
