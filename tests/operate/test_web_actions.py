"""The status page's actions through its API (the Starlette app in this process, a real store:
SQLite and Redis): a run-now request id sent twice is one request and one run, its second answer
"already requested"; a bulk pause or resume acts on each entry it names, answering each, one
unknown entry refused while the others act; every action answers 403 without ``--allow-actions``
(a token given or not) and without the token. The browser side is in test_web.py.
"""
from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest

from celery_anarchon.operate.web import TOKEN_HEADER

from operate_support import asgi
from stores_support import store_url

TOKEN = "t0ken-for-the-actions-" + "y" * 12
FORM = {"content-type": "application/x-www-form-urlencoded"}
#: a name of markup: its answers and the page must keep it as text
TRICKY = '<b>weekly</b> & "digest"'


@pytest.fixture(params=["sqlite", "redis"])
def page(request, tmp_path, namespace):
    """The page's app with actions (``site``), one without (``closed``), on a store of the
    param's kind whose ``beat_schedule`` has ``a``, ``b`` and :data:`TRICKY`, and the app's
    schedules (``api``) to read the store back."""
    from celery import Celery

    import celery_anarchon
    from celery_anarchon.operate.web import StatusSource, create_app
    url = store_url(request.param, str(tmp_path))
    app = Celery("web_actions", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace, anarchon_store_url=url,
                    beat_schedule={n: {"task": "t", "schedule": 60.0} for n in ("a", "b", TRICKY)})
    source = StatusSource(app, runs=2)
    api = celery_anarchon.schedules(app, by="tester")
    try:
        yield (create_app(source, token=TOKEN, refresh_s=0),
               create_app(source, token=None, refresh_s=0), api)
    finally:
        api.close()
        source.close()


def _post(site, path: str, fields: list[tuple[str, str]] | dict, token: str | None = TOKEN):
    """(status, headers, answer as JSON) of a form POST with the token in its header."""
    headers = {**FORM, **({TOKEN_HEADER: token} if token is not None else {})}
    status, answer_headers, body = asgi(site, "POST", path, headers=headers,
                                        body=urlencode(fields).encode())
    assert answer_headers["content-type"] == "application/json", body
    return status, answer_headers, json.loads(body)


def test_the_same_run_now_request_id_twice_is_one_run_and_answers_already_requested(page):
    site, _, api = page
    status, _, first = _post(site, "/api/entries/a/run-now", {"request_id": "click-1"})
    assert status == 200 and first["result"]["created"] and not first["already_requested"], first
    assert first["message"].startswith("run-now a: new request click-1, slot "), first
    status, _, again = _post(site, "/api/entries/a/run-now", {"request_id": "click-1"})
    assert status == 200 and again["already_requested"], again
    assert again["result"] == {**first["result"], "created": False}, again
    assert again["message"].startswith(
        "run-now a: request click-1 was already requested at "), again
    assert again["message"].endswith(f": no new run (its slot {first['message'][-29:]})"), again
    requests = [r for r in api.store.entries.load_entries().requests if r.entry == "a"]
    assert [r.request_id for r in requests] == ["click-1"], requests
    status, _, other = _post(site, "/api/entries/a/run-now", {"request_id": "click-2"})
    assert status == 200 and other["result"]["created"] and not other["already_requested"]
    assert len([r for r in api.store.entries.load_entries().requests if r.entry == "a"]) == 2


def test_a_bulk_pause_acts_on_each_entry_and_answers_each_one_unknown_refused(page):
    site, _, api = page
    status, headers, answer = _post(site, "/api/bulk/pause", [
        ("entry", "a"), ("entry", "no-such-entry"), ("entry", TRICKY), ("reason", "deploy <42>")])
    assert status == 200, answer
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert (answer["action"], answer["done"], answer["failed"]) == ("pause", 2, 1), answer
    assert [(r["entry"], r["status"]) for r in answer["results"]] == [
        ("a", 200), ("no-such-entry", 404), (TRICKY, 200)], answer
    assert "no-such-entry" in answer["results"][1]["error"], answer
    assert answer["results"][0]["result"]["pause"]["reason"] == "deploy <42>", answer
    for name in ("a", TRICKY):
        pause = api.get(name).pause
        assert pause is not None and pause.reason == "deploy <42>", (name, pause)
        assert pause.by.startswith("web:127.0.0.1@"), pause
    assert api.get("b").pause is None
    page_html = asgi(site, "GET", "/")[2]
    assert page_html.count("deploy &lt;42&gt;") == 2 and "deploy <42>" not in page_html
    status, _, answer = _post(site, "/api/bulk/resume", [("entry", "a"), ("entry", TRICKY),
                                                         ("entry", "b")])
    assert status == 200 and (answer["done"], answer["failed"]) == (3, 0), answer
    assert all(api.get(n).pause is None for n in ("a", "b", TRICKY))


def test_a_bulk_action_without_entries_or_of_another_kind_is_refused(page):
    site, _, api = page
    status, _, answer = _post(site, "/api/bulk/pause", {"reason": "x"})
    assert status == 400 and "one 'entry' form field each" in answer["error"], answer
    status, _, answer = _post(site, "/api/bulk/run-now", {"entry": "a"})
    assert status == 404 and "/api/bulk/pause, /resume" in answer["error"], answer
    status, _, answer = _post(site, "/api/bulk/pause", [("entry", "a")] * 1001)
    assert status == 400 and "given: 1001" in answer["error"], answer
    assert api.get("a").pause is None


@pytest.mark.parametrize("path", ["/api/bulk/pause", "/api/bulk/resume", "/api/entries/a/pause",
                                  "/api/entries/a/run-now"])
def test_actions_answer_403_when_off_or_without_the_token_and_change_nothing(page, path):
    site, closed, api = page
    fields = [("entry", "a"), ("reason", "x"), ("request_id", "r-1")]
    for app_, token in ((closed, TOKEN), (closed, None), (site, None), (site, TOKEN + "-no")):
        status, _, answer = _post(app_, path, fields, token=token)
        assert status == 403, (path, token, answer)
        assert ("actions are off" if app_ is closed else "wrong or missing token") in answer["error"]
    assert api.get("a").pause is None and not api.store.entries.load_entries().requests
    status, _, answer = _post(site, path, [*fields, ("token", TOKEN)], token=None)  # the form field
    assert status == 200, answer


def test_the_page_with_actions_has_its_controls_and_no_inline_handler(page):
    site, closed, _ = page
    status, headers, html = asgi(site, "GET", "/")
    assert status == 200
    nonce = re.search(r"script-src 'nonce-([^']+)'", headers["content-security-policy"]).group(1)
    assert html.count("<script") == 1 and f'<script nonce="{nonce}">' in html
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html), "an inline handler the CSP would block"
    for shown in ('id="pause-selected"', 'id="resume-selected"', 'id="bulk-reason"',
                  'id="select-all"', 'class="select" data-entry="a"',
                  'class="select" data-entry="&lt;b&gt;weekly&lt;/b&gt; &amp; &#34;digest&#34;"'):
        assert shown in html, shown
    assert 'id="reason"' not in html, "the pause's reason is asked in its row"
    closed_html = asgi(closed, "GET", "/")[2]
    assert 'class="select"' not in closed_html and 'id="pause-selected"' not in closed_html


def test_an_action_on_a_store_not_reached_answers_503_nothing_was_changed(namespace):
    """Nothing listens on port 1: the action fails before it writes anything, and its answer
    says so, with the store (masked) and the fix, not that the outcome is unknown."""
    from celery import Celery

    from celery_anarchon.operate.web import StatusSource, create_app
    app = Celery("web_down", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace,
                    anarchon_store_url="redis://:secret@127.0.0.1:1/0",
                    beat_schedule={"a": {"task": "t", "schedule": 60.0}})
    source = StatusSource(app, runs=2)
    try:
        site = create_app(source, token=TOKEN, refresh_s=0)
        for path, fields in (("/api/entries/a/pause", {"reason": "deploy"}),
                             ("/api/entries/a/run-now", {"request_id": "click-1"})):
            status, _, answer = _post(site, path, fields)
            assert status == 503, answer
            assert "nothing was changed: the store redis://:***@127.0.0.1:1/0 could not be " \
                   "reached; fix: " in answer["error"], answer
            assert "unknown" not in answer["error"] and "secret" not in json.dumps(answer), answer
    finally:
        source.close()
