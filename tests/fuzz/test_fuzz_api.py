"""``celery_anarchon.schedules(app)``: every write succeeds or raises one of our errors (a
ConfigError naming the entry or the field) and a refused one writes nothing; after any sequence
of accepted writes every read surface works."""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz import strategies as S
from fuzz.conftest import budget, count
from fuzz.support import STORES, describe, is_ours, make_app, read_everything, require, state

#: a name the writes reuse, so that sequences meet existing entries
NAME = st.one_of(st.sampled_from(["a", "b", "cfg", "caf\u00e9"]), S.NAMES)

#: the names of the valid calls (so that sequences build entries, pauses and requests)
SOME = st.sampled_from(["a", "b", "cfg", "caf\u00e9"])
VALID = st.one_of(
    st.tuples(st.just("add"), SOME, st.fixed_dictionaries(
        {"task": st.just("fuzz.t"), "schedule": st.one_of(st.integers(1, 10**5), S.CRONTABS.filter(
            lambda c: c is not None))}, optional={"args": st.lists(S.PLAIN, max_size=2),
                                                  "anarchon": S.ANARCHON})),
    st.tuples(st.just("update"), SOME, st.fixed_dictionaries({}, optional={
        "schedule": st.integers(1, 10**5), "kwargs": st.dictionaries(S.PLAIN, S.PLAIN, max_size=2),
        "options": S.APPLY_OPTIONS, "start_at": S.INSTANTS, "end_at": S.INSTANTS})),
    st.tuples(st.sampled_from(["pause", "resume", "run_now", "remove"]), SOME, st.just({})),
)
OPS = st.one_of(
    VALID, VALID,
    st.tuples(st.just("add"), NAME, st.fixed_dictionaries(
        {"task": S.TASKS, "schedule": S.SCHEDULES},
        optional={"args": S.ARGS, "kwargs": S.KWARGS, "options": S.APPLY_OPTIONS,
                  "anarchon": S.ANARCHON, "start_at": S.INSTANTS, "end_at": S.INSTANTS,
                  "by": S.BYS, "check_task": st.booleans()})),
    st.tuples(st.just("update"), NAME, st.fixed_dictionaries({}, optional={
        "task": S.TASKS, "schedule": S.SCHEDULES, "args": S.ARGS, "kwargs": S.KWARGS,
        "options": S.APPLY_OPTIONS, "anarchon": S.ANARCHON, "start_at": S.INSTANTS,
        "end_at": S.INSTANTS, "by": S.BYS, "check_task": st.booleans()})),
    st.tuples(st.just("pause"), NAME, st.fixed_dictionaries({}, optional={
        "reason": S.REASONS, "by": S.BYS})),
    st.tuples(st.just("resume"), NAME, st.fixed_dictionaries({}, optional={"by": S.BYS})),
    st.tuples(st.just("run_now"), NAME, st.fixed_dictionaries({}, optional={
        "request_id": S.REQUEST_IDS, "by": S.BYS})),
    st.tuples(st.just("remove"), NAME, st.fixed_dictionaries({}, optional={"by": S.BYS})),
)


def check_refusal(exc: BaseException, verb: str, name) -> None:
    """One of our errors, naming the entry or the field it refuses."""
    message = str(exc)
    assert message, describe(exc)
    assert any(word in message for word in ("entry", "name", "request", "reason", "by")), message


@pytest.mark.parametrize("kind", STORES)
@settings(max_examples=budget(100))
@given(ops=st.lists(OPS, min_size=1, max_size=8), since=S.DURATION_TEXTS,
       runs=st.integers(0, 30))
def test_writes_succeed_or_refuse_cleanly_and_every_read_works_after(kind, ops, since, runs):
    require(kind)
    count()
    from celery_anarchon import schedules
    app = make_app(kind)
    with schedules(app) as s:
        s._ready()
        for verb, name, kwargs in ops:
            before = state(s.store)
            try:
                getattr(s, verb)(name, **kwargs)
            except Exception as exc:
                if not is_ours(exc):
                    raise AssertionError(f"{verb}({name!r}, **{kwargs!r}) raised "
                                         f"{type(exc).__name__}:\n{describe(exc)}") from exc
                check_refusal(exc, verb, name)
                assert state(s.store) == before, f"refused {verb}({name!r}) wrote: {exc}"
                event(f"{verb}: refused ({type(exc).__name__})")
            else:
                event(f"{verb}: accepted")
    read_everything(app, since=since if isinstance(since, str) else "1h", runs=runs)
