"""A definition written straight into the store (by another version, a hand edit, a restore):
text of any shape under any name never breaks a read surface or a beat. It is shown as an error
row; the entries beside it run."""
from __future__ import annotations


import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz import strategies as S
from fuzz.conftest import budget, count
from fuzz.support import STORES, ErrorLog, make_app, read_everything, require, write_raw

#: names another writer may have used (the API refuses some of them; the store holds them)
RAW_NAMES = st.one_of(S.PLAIN, S.TEXT.filter(lambda t: 0 < len(t) <= 300))
#: bytes a hand edit or a restore may leave: not UTF-8, truncated JSON, a record of another shape
RAW_BYTES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"\xff\xfe", b'{"task":"fuzz.t","schedule":{"every":60}}\xff', b"\xc3",
                     b'{"d":"{}","v":1}', b'{"d":1}', b"{}", b"[]", b"null", b'{"r":"x"}',
                     b'{"d":"{\\"task\\":\\"fuzz.t\\",\\"schedule\\":{\\"every\\":60}}"}',
                     b'{"r":1,"b":null,"t":"x"}', b"\xed\xa0\x80"]),
    S.DEFINITION_TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")),
)


def _store_of(app):
    from celery_anarchon import schedules
    s = schedules(app)
    s._ready()
    return s, s.store


def storable(written: dict) -> bool:
    """Text a store can hold: a lone surrogate is no UTF-8 (no writer can store it; bytes that
    are not UTF-8 are written raw, below)."""
    return not any("\ud800" <= c <= "\udfff" for t in (*written, *written.values()) for c in t)


@pytest.mark.parametrize("kind", STORES)
@settings(max_examples=budget(100))
@given(written=st.dictionaries(RAW_NAMES, S.DEFINITION_TEXTS, min_size=1, max_size=4),
       pause=st.booleans(), since=S.DURATION_TEXTS,
       raw=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["entries", "pauses"]), RAW_BYTES),
                    max_size=3))
def test_a_definition_written_into_the_store_is_an_error_row_and_the_others_run(
        kind, written, pause, since, raw):
    require(kind)
    if not storable(written):
        return
    count()
    app = make_app(kind)
    s, store = _store_of(app)
    try:
        s.add("good", task="fuzz.t", schedule=60)
        for name, text in written.items():
            if name in ("good", "cfg"):
                continue
            store.entries.put_entry(name, text, by="another version", create=True)
            if pause:
                from celery_anarchon.stores.entry_store import Pause
                store.entries.set_pause(name, Pause(reason="hand", by="x", at_ms=0), by="x")
        names = [n for n in written if n not in ("good", "cfg")]
        for index, role, data in raw if names else ():
            write_raw(kind, app, names[index % len(names)], data, role)
    finally:
        s.close()
    entries = read_everything(app, since=since, runs=2)
    for name in ("good", "cfg"):
        assert not entries[name].get("problem") and entries[name]["next"], entries[name]
    problems = [n for n, e in entries.items() if e.get("problem")]
    event(f"{len(problems)} problem rows")
    assert_a_beat_runs_the_others(app)


def assert_a_beat_runs_the_others(app) -> None:
    """A Scheduler starts on the store, ticks without a failure logged, and plans the good
    entries."""
    from celery_anarchon import Scheduler
    with ErrorLog() as errors:
        beat = Scheduler(app)
        try:
            beat.tick()
            planned = set(beat.engine.plans) if hasattr(beat.engine, "plans") else None
        finally:
            beat.close()
    failed = [r for r in errors.records if "tick failed" in r.getMessage()]
    assert not failed, errors.text()
    if planned is not None:
        assert {"good", "cfg"} <= planned, planned
