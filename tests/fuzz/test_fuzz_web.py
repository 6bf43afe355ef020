"""The page: its actions (pause, resume, run-now by POST, and the bulk pause and resume of any
names) answer JSON with 200, 400 or 404 for any name, reason, request id and by, never a 500; its query parameters never break it; and after
them every read surface works."""
from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fuzz import strategies as S
from fuzz.conftest import budget, count
from fuzz.support import STORES, asgi, make_app, read_everything, require, state

TOKEN = "fuzz-token-0123456789abcdef"
NAME = st.one_of(st.sampled_from(["cfg", "a", "caf\u00e9", "nope"]), S.PLAIN, S.TEXT)
FIELD = st.one_of(S.PLAIN, S.TEXT)


@st.composite
def actions(draw):
    """(path, form fields as pairs) of one action: an entry's, or a bulk one of 0 to 3 names."""
    action = draw(st.sampled_from(["pause", "resume", "run-now", "bulk/pause", "bulk/resume"]))
    fields = draw(st.fixed_dictionaries({}, optional={"reason": FIELD, "by": FIELD,
                                                      "request_id": FIELD}))
    if action.startswith("bulk/"):
        names = draw(st.lists(NAME, max_size=3))
        return f"/api/{action}", [("entry", n) for n in names] + list(fields.items())
    return f"/api/entries/{draw(NAME)}/{action}", list(fields.items())


def _form(fields: list[tuple[str, str]]) -> bytes:
    """The form as a client sends it; a lone surrogate becomes the bytes that are not UTF-8 a
    hostile client may send."""
    return urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in fields]).encode()


@pytest.mark.parametrize("kind", STORES)
@settings(max_examples=budget(80))
@given(batch=st.lists(actions(), min_size=1, max_size=5),
       query=st.dictionaries(st.sampled_from(["q", "page", "per_page", "refresh", "x"]), FIELD,
                             max_size=3))
def test_page_actions_answer_json_never_500_and_the_page_works_after(kind, batch, query):
    require(kind)
    count()
    from celery_anarchon import schedules
    from celery_anarchon.operate.web import StatusSource, create_app
    app = make_app(kind)
    with schedules(app) as s:
        s.add("a", task="fuzz.t", schedule=30)
    source = StatusSource(app, runs=2)
    try:
        site = create_app(source, token=TOKEN, refresh_s=5.0)
        for path, fields in batch:
            before = state(source.store)
            status, headers, body = asgi(
                site, "POST", path, body=_form(fields),
                headers=[(b"x-anarchon-token", TOKEN.encode()),
                         (b"content-type", b"application/x-www-form-urlencoded")])
            event(f"{path.rsplit('/', 1)[1] if '/bulk/' not in path else path}: {status}")
            assert status in (200, 400, 404), (path, fields, status, body[:2000])
            assert headers["content-type"] == "application/json", body[:500]
            answer = json.loads(body)
            for one in answer.get("results", ()) if "/bulk/" in path else ():
                assert one["status"] in (200, 400, 404) and (one["status"] == 200) != (
                    "error" in one), (path, fields, one)
            if status != 200:
                assert answer["error"], answer
                assert state(source.store) == before, (path, fields, answer)
        query_text = urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in query.items()})
        status, _, page = asgi(site, "GET", "/", query_text)
        assert status == 200, page[:2000]
    finally:
        source.close()
    read_everything(app, runs=2)
