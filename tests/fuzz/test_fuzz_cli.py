"""``celery anarchon add / update / pause / resume / run-now / remove``: each exits 0, or 2, 3, 4
with one ``Error:`` line, never a traceback; a refused command writes nothing; after any sequence
of them every read command and the page work."""
from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz import strategies as S
from fuzz.conftest import budget, count
from fuzz.support import STORES, cli, cli_ok, make_app, read_everything, require, state

#: names as the shell gives them: text (argv may hold lone surrogates: surrogateescape)
NAME = st.one_of(st.sampled_from(["a", "b", "cfg", "caf\u00e9", "-x", "--help"]), S.PLAIN, S.TEXT)


@st.composite
def commands(draw) -> list[str]:
    verb = draw(st.sampled_from(["add", "add", "update", "pause", "resume", "run-now", "remove"]))
    name = draw(NAME)
    if verb in ("add", "update"):
        args = draw(S.cli_write_args(verb, name))
    else:
        args = [verb, name]
        if verb == "pause" and draw(st.booleans()):
            args += ["--reason", draw(S.TEXT)]
        if verb == "run-now" and draw(st.booleans()):
            args += ["--request-id", draw(S.REQUEST_IDS.map(str))]
        if draw(st.booleans()):
            args += ["--by", draw(S.TEXT)]
        if verb != "remove" and draw(st.booleans()):
            args.append("--json")
    return args


@pytest.mark.parametrize("kind", STORES)
@settings(max_examples=budget(80))
@given(batch=st.lists(commands(), min_size=1, max_size=6), since=S.DURATION_TEXTS)
def test_commands_exit_cleanly_refuse_without_writing_and_reads_work_after(kind, batch, since):
    require(kind)
    count()
    from celery_anarchon import schedules
    app = make_app(kind)
    with schedules(app) as s:
        s._ready()
        for args in batch:
            before = state(s.store)
            result = cli(app, args)
            cli_ok(result, args, codes=(0, 2, 3, 4))
            event(f"{args[0]}: exit {result.exit_code}")
            if result.exit_code != 0:
                assert state(s.store) == before, f"refused {args!r} wrote: {result.stderr}"
    read_everything(app, since=since, runs=2)
