"""The status page (``celery anarchon web``) in a real browser, against a running cluster.

Three real beats and a worker (SQLite store, Redis broker, tests/support/apps/schedules_app.py) run a
1-s config entry ``clock`` and a 2-s store entry whose name is HTML; the page is a real
``celery anarchon web --allow-actions --token ...`` process, read by headless Debian chromium
through Selenium. It lists the three instances and both entries with their runs in the strip;
the entry name shows as text (escaped); a pause clicked on the page (the token typed in the
page's token field) stops ``clock``: no slot after the page had the answer runs, the
history records the paused slots, and the page shows the entry paused. A wrong token is refused
(403) and changes nothing. The screenshot of that page is docs/status-page.png: written when the
file is missing or ``ANARCHON_UPDATE_SCREENSHOT=1`` (every run's copy is in the test's tmp dir).

Without ``--allow-actions`` the page has no buttons and every action answers 403, with or
without a token; the store's password never appears in the page or its JSON; with actions and no
token given, the page makes one and prints it once.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import celery_anarchon
from celery_anarchon.errors import ConfigError
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import RunEvent
from celery_anarchon.operate.web import TOKEN_HEADER, check_address, resolve_token, token_matches

from backends import backdate_memory_start
from cluster import APPS, Cluster, read_executions
from conftest import REDIS_URL, require_server
from paths import DOCS
from operate_support import asgi, free_port, http, wait_served
from stores_support import store_url, wait_until
from broker_reads import queued_messages
from schedules_cluster import Run, cluster_env
from web_browser import (  # noqa: F401  (browser: a fixture)
    UPDATE_SCREENSHOTS, browser, keep_screenshot, sideways, viewport)

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the app the processes run)

SCREENSHOT, ACTIONS_SCREENSHOT = DOCS / "status-page.png", DOCS / "status-page-actions.png"
RUN_NOW_SCREENSHOT = DOCS / "status-page-run-now.png"
#: a store entry whose name is markup: the page must show it as text
TRICKY = '<i>nightly</i> & "report"'
TOKEN = "t0ken-for-the-test-" + "x" * 12
BEATS = ("beat-a", "beat-b", "beat-c")


#: a run-now request id as the page makes it: a UUIDv7
UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
#: the page's next POST reaches its server, but its answer never reaches the page
LOSE_FIRST_ANSWER = """
var real = window.fetch, lost = false;
window.fetch = function (url, options) {
  var answer = real(url, options);
  if (lost || !options || options.method !== "POST") return answer;
  lost = true;
  return answer.then(function () { throw new TypeError("the answer was lost"); });
};"""


def _message(driver) -> str:
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, "message").text


def _entry_row(driver, name: str):
    from selenium.webdriver.common.by import By
    for row in driver.find_elements(By.CSS_SELECTOR, "tr.entry"):
        if row.get_attribute("data-entry") == name:
            return row
    return None


def _click(driver, name: str, selector: str) -> None:
    """Clicks ``selector`` in ``name``'s row. The page replaces its rows when it refreshes (after
    an action too); a row replaced between finding it and clicking raises instead of clicking,
    so the row is found again: still one click."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def clicked(d) -> bool:
        try:
            _entry_row(d, name).find_element(By.CSS_SELECTOR, selector).click()
        except StaleElementReferenceException:
            return False
        return True
    WebDriverWait(driver, 10).until(clicked)


def _run_now(driver, name: str) -> None:
    """Clicks run now in ``name``'s row, then the confirmation the row then shows."""
    _click(driver, name, "button[data-action=run-now]")
    _click(driver, name, "button[data-confirm=run-now]")


def _cells(driver, name: str, colour: str) -> int:
    """How many runs of ``name``'s strip have the colour class ``colour`` (0: no such row; a row
    replaced by the page's refresh meanwhile counts as 0 too)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    try:
        row = _entry_row(driver, name)
        return 0 if row is None else len(row.find_elements(By.CSS_SELECTOR, f".strip .run.{colour}"))
    except StaleElementReferenceException:
        return 0


def test_the_page_shows_the_cluster_and_a_pause_from_it_stops_the_entry(browser, tmp_path, namespace):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = store_url("sqlite", str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env("sqlite", url, namespace, out, ANARCHON_SC_SYNC_INTERVAL="1",
                      ANARCHON_SC_MAX_LATE="5", ANARCHON_SC_CLOCK="1")
    store = open_store(url, namespace=namespace, instance_id="test")
    store.prepare(["clock", TRICKY])
    backdate_memory_start(store, ["clock", TRICKY], 120_000)
    api = celery_anarchon.schedules(schedules_app.make_app(env), by="tester@ops")
    api.add(TRICKY, task=schedules_app.TASK, schedule=2.0)
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        cluster.worker("worker")
        for name in BEATS:
            cluster.beat(name)
        web = cluster.start("web", "anarchon", "web", "--port", str(port), "--allow-actions",
                            "--token", TOKEN, "--refresh", "1")
        wait_served(base, web)

        def ready():
            time.sleep(0.2)   # the poll's pace: each read is a whole overview of the store
            data = json.loads(http(base + "/api/status")[1])
            runs = {e["name"]: [r for r in e["runs"] if r["event"] == "sent"] for e in data["entries"]}
            return (len(data["instances"]) == 3 and len(runs.get("clock", ())) >= 3
                    and len(runs.get(TRICKY, ())) >= 1)
        run.wait(ready, 60, "three live instances and sent runs of both entries")
        run.phase("start")

        browser.get(base + "/?refresh=0")
        assert browser.title == f"anarchon · {namespace}"
        instances = browser.find_elements(By.CSS_SELECTOR, "#instances tr.instance")
        assert len(instances) == 3, browser.page_source
        pids = {str(cluster.procs[b].pid) for b in BEATS}
        assert {row.text.split()[0].rsplit(":", 1)[1] for row in instances} == pids
        tricky = _entry_row(browser, TRICKY)
        assert tricky is not None, browser.page_source
        name_cell = tricky.find_element(By.CSS_SELECTOR, ".entry-name")
        assert name_cell.text == TRICKY and not name_cell.find_elements(By.TAG_NAME, "i")
        assert _cells(browser, "clock", "ok") >= 3 and _cells(browser, TRICKY, "ok") >= 1
        assert "sent" in browser.find_element(By.ID, "legend").text

        # a wrong token is refused and changes nothing
        status, body = http(f"{base}/api/entries/clock/pause", data=b"reason=x",
                            headers={TOKEN_HEADER: TOKEN + "-wrong"})
        assert status == 403 and "token" in json.loads(body)["error"], (status, body)
        assert api.get("clock").pause is None

        # pause from the page: the token typed into its field, the reason in the entry's row
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        _click(browser, "clock", "button[data-action=pause]")
        _entry_row(browser, "clock").find_element(By.CSS_SELECTOR, "input.pause-reason").send_keys(
            "maintenance <window>")
        _click(browser, "clock", "button[data-confirm=pause]")
        WebDriverWait(browser, 10).until(
            lambda d: d.find_element(By.ID, "message").text == "pause clock: done")
        done_ms = time.time() * 1000   # the page had the answer: the pause was written
        pause = api.get("clock").pause
        assert pause is not None and pause.reason == "maintenance <window>", pause
        assert pause.by.startswith("web:127.0.0.1@"), pause

        def paused_slots():
            found = [h for h in store.history.read("clock", limit=50)
                     if h.event is RunEvent.PAUSED and h.slot_ms > pause.at_ms]
            return found if len(found) >= 3 else None
        paused = run.wait(paused_slots, 30, "three paused slots of clock in the history")
        assert all(h.detail == f"paused by {pause.by}: maintenance <window>" for h in paused)
        run.phase("pause")

        # the page shows it paused (the state, the resume button, the strip, through its refresh)
        browser.get(base + "/")
        WebDriverWait(browser, 10).until(lambda d: _cells(d, "clock", "paused") >= 3)
        row = _entry_row(browser, "clock")
        assert "paused" in row.find_element(By.CSS_SELECTOR, ".entry-state").text
        assert "maintenance <window>" in row.find_element(By.CSS_SELECTOR, ".entry-state").text
        assert row.find_elements(By.CSS_SELECTOR, "button[data-action=resume]")
        shot = tmp_path / "status-page.png"
        browser.save_screenshot(str(shot))
        if not SCREENSHOT.exists() or os.environ.get(UPDATE_SCREENSHOTS) == "1":
            shutil.copyfile(shot, SCREENSHOT)
        run.phase("page")

        # run now from the page (and confirmed), whose first answer is lost on the way back (the
        # request reached the store, the page never heard): the page keeps the click's request id
        # and says the outcome is unknown; the next click repeats that same request: no new run
        browser.get(base + "/?refresh=0")
        browser.execute_script(LOSE_FIRST_ANSWER)
        _run_now(browser, TRICKY)
        WebDriverWait(browser, 10).until(lambda d: "is unknown" in _message(d))
        (made,) = UUID7.findall(_message(browser))
        assert "click run now again to repeat this same request" in _message(browser)
        _run_now(browser, TRICKY)
        WebDriverWait(browser, 10).until(lambda d: "no new run" in _message(d))
        assert f"run-now {TRICKY}: request {made} was already requested at " in _message(browser)
        (request,) = [r for r in api.store.entries.load_entries().requests if r.entry == TRICKY]
        assert request.request_id == made and request.by.startswith("web:127.0.0.1@"), request
        _run_now(browser, TRICKY)
        WebDriverWait(browser, 10).until(lambda d: "new request" in _message(d))
        (other,) = UUID7.findall(_message(browser))
        assert other != made, "a new click, a new request"
        requested = {request.slot_ms} | {r.slot_ms for r in api.store.entries.load_entries().requests
                                         if r.request_id == other}
        run.wait(lambda: requested <= {x["slot"] for x in run.runs(TRICKY)}, 2 * 1 + 5 + 5,
                 "both run-now runs of the store entry")
        run.phase("run-now")
        for name in BEATS:
            cluster.stop(name)
        run.wait(lambda: not queued_messages(env["ANARCHON_SC_QUEUE"]), 60,
                 "the worker to empty the queue")
    finally:
        cluster.stop_all()
        api.close()
    logs = cluster.logs()
    store.close()
    assert TOKEN not in cluster.text("web"), "the page printed a token it was given"
    ran_after = [x for x in read_executions(out)
                 if x["entry"] == "clock" and x["slot"] > done_ms]
    assert not ran_after, f"slots of clock after the pause ran: {ran_after}\n{logs}"
    assert any(x["entry"] == "clock" for x in read_executions(out))
    ran = collections.Counter(x["slot"] for x in read_executions(out) if x["entry"] == TRICKY)
    assert len(requested) == 2 and all(ran[slot] == 1 for slot in requested), (requested, ran)
    print(f"web test: {time.monotonic() - began:.1f} s; phases "
          + ", ".join(f"{k} {v:.1f}" for k, v in run.costs.items()))


#: every POST the page sends, with its answer: window.posts, [url, body, status, answer] each
RECORD_POSTS = """
var real = window.fetch;
window.posts = [];
window.fetch = function (url, options) {
  var answer = real(url, options);
  if (!options || options.method !== "POST") return answer;
  var post = [String(url), options.body.toString(), null, null];
  window.posts.push(post);
  answer.then(function (r) { return r.clone().json().then(function (j) { post[2] = r.status; post[3] = j; }); });
  return answer;
};"""


@pytest.mark.parametrize("width", [1024, 1400])
def test_run_now_is_confirmed_one_id_a_click_and_a_bulk_pause_shows_its_reason_on_each_row(
        browser, tmp_path, namespace, width):
    """The page (a real ``anarchon web --allow-actions`` process on a SQLite store, no beat):
    run now asks for a confirmation; its confirm clicked twice at once sends one request id
    twice: one request in the store, the second answer "already requested". Two rows and a third
    whose store entry is removed meanwhile, selected and paused with one reason: the two paused
    with the reason shown on their rows, the third answered "no entry". The screenshot of that
    page is docs/status-page-actions.png, that of the confirmation docs/status-page-run-now.png
    (written as test_the_page_shows_the_cluster... writes its own), both at 1024 px; at each
    width the page, with a row asking, never scrolls sideways."""
    from celery import Celery
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    url = store_url("sqlite", str(tmp_path))
    app = Celery("cli_app", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_store_url=url, anarchon_namespace=namespace,
                    beat_schedule={"config-entry": {"task": "cli_app.report", "schedule": 60.0}})

    @app.task(name="cli_app.report", shared=False)
    def report():
        """The task of tests/support/apps/cli_app.py, as the page's process has it."""
    api = celery_anarchon.schedules(app, by="tester@ops")
    for name in ("billing", TRICKY, "gone"):
        api.add(name, task="cli_app.report", schedule=300.0)
    # a new store vouches for no request id made in its first seconds (the page's ids are made
    # of the store's clock): as if it had run for two minutes
    backdate_memory_start(api.store, ["config-entry", "billing", TRICKY, "gone"], 120_000)
    procs = Cluster(str(tmp_path), {"ANARCHON_CLI_NAMESPACE": namespace}, app="cli_app")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        web = procs.start("web", "anarchon", "web", "--port", str(port), "--allow-actions",
                          env={"ANARCHON_CLI_STORE": url, "ANARCHON_WEB_TOKEN": TOKEN})
        wait_served(base, web)
        viewport(browser, width, 800)
        browser.get(base + "/?refresh=0")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.execute_script(RECORD_POSTS)

        # run now: nothing is sent before the confirmation; confirm clicked twice at once
        _click(browser, "billing", "button[data-action=run-now]")
        asking = _entry_row(browser, "billing").find_element(By.CSS_SELECTOR, ".asking")
        assert "one more run, request" in asking.text and "cancel" in asking.text, asking.text
        assert browser.execute_script("return window.posts.length") == 0
        scroll, client = sideways(browser)
        assert scroll <= client, f"at {width} px the page asking scrolls sideways: {scroll} > {client}"
        if width == 1024:
            keep_screenshot(browser, tmp_path, RUN_NOW_SCREENSHOT)
        browser.execute_script(
            "var b = arguments[0].querySelector('button[data-confirm=run-now]'); b.click(); b.click();",
            _entry_row(browser, "billing"))
        WebDriverWait(browser, 10).until(lambda d: d.execute_script(
            "return window.posts.length == 2 && window.posts.every(function (p) { return p[2]; })"))
        posts = browser.execute_script("return window.posts")
        assert [p[0] for p in posts] == ["/api/entries/billing/run-now"] * 2, posts
        assert posts[0][1] == posts[1][1] and UUID7.fullmatch(posts[0][1].split("=", 1)[1]), posts
        assert [p[2] for p in posts] == [200, 200], posts
        assert sorted(p[3]["already_requested"] for p in posts) == [False, True], posts
        (request,) = api.store.entries.load_entries().requests
        assert (request.entry, request.request_id) == ("billing", posts[0][1].split("=", 1)[1])
        WebDriverWait(browser, 10).until(lambda d: not d.find_elements(By.CSS_SELECTOR, ".asking"))

        # bulk pause of three selected rows, one of whose entry is removed before the click
        for name in ("billing", TRICKY, "gone"):
            _click(browser, name, "input.select")
        assert browser.find_element(By.ID, "selected-count").text == "3"
        api.remove("gone")
        browser.find_element(By.ID, "bulk-reason").send_keys("db migration <#42>")
        browser.find_element(By.ID, "pause-selected").click()
        WebDriverWait(browser, 10).until(lambda d: "2 done, 1 failed" in _message(d))
        items = {li.get_attribute("data-entry"): li.text
                 for li in browser.find_elements(By.CSS_SELECTOR, "#message li")}
        assert items["billing"] == "billing: paused" and items[TRICKY] == f"{TRICKY}: paused"
        assert "no entry" in items["gone"] or "gone" in items["gone"], items

        def shown_paused(d):
            rows = [_entry_row(d, n) for n in ("billing", TRICKY)]
            return all(r is not None and "db migration <#42>" in r.find_element(
                By.CSS_SELECTOR, ".entry-state").text for r in rows) and _entry_row(d, "gone") is None
        WebDriverWait(browser, 10).until(shown_paused)
        for name in ("billing", TRICKY):
            pause = api.get(name).pause
            assert pause is not None and pause.reason == "db migration <#42>", (name, pause)
            row = _entry_row(browser, name)
            assert "paused" in row.find_element(By.CSS_SELECTOR, ".entry-state").text
            assert row.find_element(By.CSS_SELECTOR, "input.select").is_selected(), "kept selected"
        assert api.get("config-entry").pause is None
        assert browser.find_element(By.ID, "selected-count").text == "2"
        browser.execute_script("window.scrollTo(0, 0)")   # the clicks scrolled the rows into view
        scroll, client = sideways(browser)
        assert scroll <= client, f"at {width} px the page scrolls sideways: {scroll} > {client}"
        if width == 1024:
            keep_screenshot(browser, tmp_path, ACTIONS_SCREENSHOT)
    finally:
        procs.stop_all()
        api.close()


def test_without_actions_posts_are_refused_and_no_password_is_shown(tmp_path, namespace):
    """Two page processes at once: one without ``--allow-actions`` on a store URL with a
    password (no buttons, 403 with or without a token, the password masked in the page and the
    JSON); one with ``--allow-actions`` and no token (it prints a new one, which works)."""
    require_server(REDIS_URL, "Redis")
    secret_url = REDIS_URL.replace("redis://", "redis://:s3cretpw@", 1)
    procs = Cluster(str(tmp_path), {"ANARCHON_CLI_NAMESPACE": namespace}, app="cli_app")
    closed_port, open_port = free_port(), free_port()
    closed = procs.start("closed", "anarchon", "web", "--port", str(closed_port),
                         env={"ANARCHON_CLI_STORE": secret_url, "ANARCHON_WEB_TOKEN": TOKEN})
    opened = procs.start("opened", "anarchon", "web", "--port", str(open_port), "--allow-actions",
                         env={"ANARCHON_CLI_STORE": store_url("sqlite", str(tmp_path))})
    try:
        closed_base, open_base = f"http://127.0.0.1:{closed_port}", f"http://127.0.0.1:{open_port}"
        wait_served(closed_base, closed)
        wait_served(open_base, opened)
        page, data = http(closed_base + "/")[1], http(closed_base + "/api/status")[1]
        for text in (page, data, closed.text()):
            assert "s3cretpw" not in text
        assert ":***@127.0.0.1" in page and ":***@127.0.0.1" in data
        assert "config-entry" in page
        assert "data-action" not in page and 'id="token"' not in page
        for headers in ({}, {TOKEN_HEADER: TOKEN}):
            for action in ("pause", "resume", "run-now"):
                status, body = http(f"{closed_base}/api/entries/config-entry/{action}",
                                    data=b"", headers=headers)
                assert status == 403 and "--allow-actions" in body, (action, status, body)
        assert http(closed_base + "/", headers={"Host": "attacker.example"})[0] == 400

        line = procs.wait_log("opened", "the actions' token", 10) and next(
            ln for ln in opened.text().splitlines() if "the actions' token" in ln)
        token = line.rsplit(": ", 1)[1].strip()
        assert opened.text().count(token) == 1
        status, body = http(f"{open_base}/api/entries/config-entry/pause",
                            data=f"token={token}&reason=deploy".encode(),
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 200 and json.loads(body)["result"]["pause"]["reason"] == "deploy", body
        assert 'data-action="resume"' in http(open_base + "/")[1]
        status, _ = http(f"{open_base}/api/entries/config-entry/resume", data=b"",
                         headers={TOKEN_HEADER: "not-" + token})
        assert status == 403
        form = {TOKEN_HEADER: token, "Content-Type": "application/x-www-form-urlencoded"}
        status, body = http(f"{open_base}/api/entries/config-entry/run-now",
                            data=b"request_id=ticket-1", headers=form)
        assert status == 400 and "resume it first" in body, body   # paused: refused
        assert http(f"{open_base}/api/entries/config-entry/resume", data=b"", headers=form)[0] == 200
        status, body = http(f"{open_base}/api/entries/config-entry/run-now",
                            data=b"request_id=ticket-1", headers=form)
        first = json.loads(body)["result"]
        assert status == 200 and first["request_id"] == "ticket-1" and first["created"], body
        status, body = http(f"{open_base}/api/entries/config-entry/run-now",
                            data=b"request_id=ticket-1", headers=form)
        assert status == 200 and json.loads(body)["result"] == {**first, "created": False}, body
        status, body = http(f"{open_base}/api/entries/config-entry/run-now", data=b"", headers=form)
        made = json.loads(body)["result"]
        assert status == 200 and made["created"] and UUID7.fullmatch(made["request_id"]), body
        requests = json.loads(http(open_base + "/api/status")[1])["run_now"]
        assert [r["request_id"] for r in requests] == ["ticket-1", made["request_id"]], requests
        page = http(open_base + "/")[1]
        store_ms = int(re.search(r'<main id="status" data-store-ms="(\d+)"', page).group(1))
        assert abs(store_ms - made["requested_ms"]) < 60_000, "the store's clock, for the page's ids"
        status, body = http(f"{open_base}/api/entries/no-such-entry/pause", data=b"",
                            headers={TOKEN_HEADER: token})
        assert status == 404 and "no-such-entry" in json.loads(body)["error"], body
    finally:
        procs.stop_all()


def test_token_rules(monkeypatch):
    """The token: off without actions; given, else the environment's, else a new random one;
    an empty one refused; compared whole."""
    monkeypatch.delenv("ANARCHON_WEB_TOKEN", raising=False)
    assert resolve_token(False, "x") == (None, False)
    assert resolve_token(True, "given") == ("given", False)
    made, generated = resolve_token(True, None)
    assert generated and len(made) >= 32 and made != resolve_token(True, None)[0]
    monkeypatch.setenv("ANARCHON_WEB_TOKEN", "from-env")
    assert resolve_token(True, None) == ("from-env", False)
    with pytest.raises(ConfigError, match="empty"):
        resolve_token(True, "  ")
    assert token_matches("abc", "abc")
    assert not token_matches("abc", "ab") and not token_matches("abc", None)
    assert not token_matches(None, "abc")


#: markup in every value of the status data: the page must show it as text
EVIL = '<script>alert("x")</script>&amp;'


def _status_data() -> dict:
    """Status data in the shape of overview(): a leased entry, a stale instance, a
    disagreement, a partial entry, skips and a run-now request, markup in every string."""
    t = "2026-03-29T01:00:00.000+00:00"
    run = {"slot": t, "event": "late", "at": t, "instance": EVIL, "attempt": 1, "task_id": EVIL,
           "detail": "late by 9 s " + EVIL}
    return {
        "namespace": EVIL, "generated": t,
        "store": {"url": "redis://:***@h:6379/0", "kind": "redis", "durability": EVIL,
                  "reachable": True, "error": None, "warnings": [EVIL], "clock": t, "skew_ms": 3,
                  "entries": True},
        "instance_records": True,
        "instances": [{"instance_id": EVIL, "host": EVIL, "pid": 7, "version": EVIL,
                       "started": t, "last_tick": t, "last_tick_age_s": 42.0, "skew_ms": -2,
                       "entries": 1, "ticking": False, "stale": True}],
        "entries": [{"name": EVIL, "source": "store", "task": EVIL, "schedule": EVIL,
                     "timezone": EVIL, "next": [t], "problem": EVIL, "leased": True,
                     "shadowed": False, "paused": {"by": EVIL, "reason": EVIL, "since": t},
                     "runs": [run, {**run, "event": "sent"}], "last": run,
                     "lease": {"slot": t, "state": "started", "attempt": 2, "holder": EVIL,
                               "token": 17, "expires": t, "queue_deadline": None,
                               "expired": True},
                     "run_now": [{"entry": EVIL, "request_id": EVIL, "slot": t, "by": EVIL,
                                  "requested": t}]}],
        "run_now": [{"entry": EVIL, "request_id": EVIL, "slot": t, "by": EVIL, "requested": t}],
        "partial": [{"entry": EVIL, "run_by": [EVIL], "not_run_by": [EVIL]}],
        "disagreements": [{"entry": EVIL, "definitions": [
            {"fingerprint": EVIL, "source": "config", "instances": [EVIL], "definition": EVIL}],
            "fix": None}, {"entry": EVIL, "definitions": [
            {"fingerprint": EVIL, "source": "config", "instances": [EVIL], "definition": EVIL},
            {"fingerprint": EVIL, "source": "store", "instances": [EVIL], "definition": EVIL}],
            "fix": "Fix: keep one definition " + EVIL}],
        "unsaved": [EVIL],
        "refused": [{"entry": EVIL, "error": "left out (id 7): " + EVIL, "instances": [EVIL]}],
    }


def test_the_page_says_when_an_entry_starts_and_when_it_ended():
    from celery_anarchon.operate.web import render_page
    data = _status_data()
    [base] = data["entries"]
    base = {**base, "paused": None, "problem": None, "lease": None, "leased": False}
    t = "2026-03-29T01:00:00.000+00:00"
    data["entries"] = [
        {**base, "name": "soon", "state": "waiting", "start_at": t, "end_at": None},
        {**base, "name": "done", "state": "ended", "start_at": None, "end_at": t, "next": []},
        {**base, "name": "ending", "state": "running", "start_at": None, "end_at": t}]
    page = render_page(data, actions=False)
    at = f'<time class="ago" datetime="{t}" data-ms="1774746000000" title="2026-03-29 01:00:00 UTC">'
    for shown in ('<span class="state st-unknown">waiting</span>', f"starts at {at}0 s ago</time>",
                  '<span class="state st-unknown">ended</span>', f"ends at {at}0 s ago</time>"):
        assert shown in page, shown


def test_a_missed_run_is_its_own_colour_in_the_strip_and_listed_among_the_skips():
    from celery_anarchon.operate.page import attention, recent_skips
    from celery_anarchon.operate.web import render_page
    data = _status_data()
    [base] = data["entries"]
    t = "2026-03-29T01:00:00.000+00:00"
    missed = {"slot": t, "event": "missed", "at": t, "instance": "a", "attempt": 1,
              "task_id": "", "detail": "no instance claimed it in time"}
    entry = {**base, "name": "gap", "paused": None, "problem": None, "lease": None,
             "leased": False, "runs": [missed], "last": missed}
    data["entries"] = [entry]
    page = render_page(data, actions=False)
    assert 'class="run missed"' in page and "missed: no instance claimed it in time" in page
    assert recent_skips(data) == [("gap", missed)]
    assert attention(entry) == "missed"


def test_every_value_on_the_page_is_escaped_and_every_part_shown():
    from celery_anarchon.operate.web import render_page
    page = render_page(_status_data(), actions=True, nonce="n0nce")
    assert "<script>alert" not in page and 'alert("x")' not in page
    assert page.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;amp;") >= 20
    assert page.count("<script") == 1 and '<script nonce="n0nce">' in page
    for shown in ("stopped ticking (42.0 s since its last tick)", "instances disagree on entry",
                  "is run by", "its entries are not saved yet", "holder &lt;script&gt;",
                  "token 17", "(expired)", "late by 9 s", "Recent skips", "Run-now requests",
                  'class="run skip"', 'class="run ok"', 'data-action="resume"',
                  'class="state st-paused"', "redis://:***@h:6379/0", "(store entry) on",
                  "(beat_schedule) on", "Fix: keep one definition &lt;script&gt;",
                  "is left out, not run (our rules refuse it; the others run)",
                  "left out (id 7): &lt;script&gt;"):
        assert shown in page, shown
    closed = render_page(_status_data(), actions=False)
    assert "data-action" not in closed and 'id="token"' not in closed
    data = _status_data()
    data["store"]["entries"] = False     # NATS: no pauses, so no buttons, and it says why
    page = render_page(data, actions=True)
    assert "data-action" not in page and "holds no pauses or run-now requests" in page


def test_a_port_in_use_is_named_with_the_fix():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--port {port} .*fix: pick a free port"):
            check_address("127.0.0.1", port)
    check_address("127.0.0.1", port)   # free again


def test_refresh_is_clamped_unknown_api_routes_answer_json_and_a_short_token_is_warned_of(
        tmp_path, namespace):
    from celery_anarchon.operate.web import StatusSource, create_app
    from celery import Celery
    app = Celery("web_inline", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace,
                    anarchon_store_url=f"sqlite:///{tmp_path / 'store.sqlite3'}",
                    beat_schedule={"e": {"task": "t", "schedule": 60.0}})
    source = StatusSource(app, runs=0)
    try:
        site = create_app(source, token=None, refresh_s=5.0)
        for query, shown in (("refresh=1e309", "5000"), ("refresh=inf", "5000"),
                             ("refresh=nan", "5000"), ("refresh=0.001", "1000"),
                             ("refresh=99999", "3600000"), ("refresh=0", "0"), ("", "5000")):
            status, _, body = asgi(site, "GET", "/", query)
            assert status == 200 and f'data-refresh-ms="{shown}"' in body, (query, status, body[:300])
        status, headers, body = asgi(site, "GET", "/api/nope")
        assert status == 404 and headers["content-type"] == "application/json"
        assert "no such API route: GET /api/nope" in json.loads(body)["error"]
        assert asgi(site, "POST", "/api/entries/e/explode")[0] == 404
    finally:
        source.close()
    from celery_anarchon.operate.web import token_warning
    assert "3 characters, fewer than 16" in token_warning("abc", False)
    assert token_warning("abc", True) is None and token_warning("x" * 16, False) is None


def test_the_page_shows_entries_needing_attention_first_pages_the_rest_and_filters_by_name(
        tmp_path, namespace):
    import re
    from celery import Celery
    from celery_anarchon.operate.page import entries_page, render_page
    from celery_anarchon.operate.web import StatusSource, create_app
    run = {"slot": "2026-03-29T01:00:00+00:00", "event": "sent", "at": None, "instance": "A",
           "attempt": 1, "task_id": "t", "detail": ""}
    entries = [{"name": f"job-{i:03d}", "state": "running", "paused": None, "problem": None,
                "lease": None, "runs": [run], "next": [], "run_now": []} for i in range(250)]
    entries[200]["paused"] = {"by": "ops", "reason": "", "since": run["slot"]}
    entries[150]["problem"] = "breaks a rule"
    entries[120]["runs"] = [{**run, "event": "late"}, run]
    entries[7]["lease"] = {"expired": True, "state": "started", "holder": "w", "token": 3}
    data = {**_status_data(), "entries": entries}
    page = render_page(data, refresh_s=5, params={"refresh": "5"})
    names = re.findall(r'<tr class="entry[^"]*" data-entry="([^"]+)"', page)
    assert names[:4] == ["job-007", "job-120", "job-150", "job-200"] and len(names) == 100
    assert names[4:6] == ["job-000", "job-001"]
    assert "entries 1–100 of 250" in page and "page 1 of 3" in page and "4</span> need attention" in page
    assert 'href="?refresh=5&amp;page=2"' in page and 'id="prev-page"' not in page
    last = entries_page(entries, page="99", per_page="100")
    assert (last["page"], last["first"], last["last"]) == (3, 201, 250)
    assert entries_page(entries, per_page="100000")["per_page"] == 1000
    assert entries_page(entries, page="x", per_page="y")["page"] == 1
    found = render_page(data, query="JOB-12", params={"q": "JOB-12", "refresh": "5"})
    names = re.findall(r'<tr class="entry[^"]*" data-entry="([^"]+)"', found)
    assert names == ["job-120"] + [f"job-12{i}" for i in range(10) if i != 0]
    assert "entries 1–10 of 10 matching" in found and 'id="all-entries" href="?refresh=5"' in found
    assert "no entry matches" in render_page(data, query="nothing-like-it")
    app = Celery("web_paging", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace,
                    anarchon_store_url=f"sqlite:///{tmp_path / 'store.sqlite3'}",
                    beat_schedule={f"e{i}": {"task": "t", "schedule": 60.0} for i in range(5)})
    source = StatusSource(app, runs=2)
    try:
        site = create_app(source, token=None, refresh_s=5.0)
        status, _, body = asgi(site, "GET", "/", "q=e3&per_page=1")
        assert status == 200 and re.findall(r'data-entry="([^"]+)"', body) == ["e3"]
        status, _, body = asgi(site, "GET", "/", "per_page=2&page=2")
        assert re.findall(r'<tr class="entry[^"]*" data-entry="([^"]+)"', body) == ["e1", "e2"]  # after celery.backend_cleanup, e0
        assert len(json.loads(asgi(site, "GET", "/api/status", "q=e3")[2])["entries"]) >= 5
    finally:
        source.close()


def test_one_broken_entry_is_an_error_row_and_never_takes_down_the_page(tmp_path, namespace):
    """A beat_schedule schedule given as text, and store entries an older version accepted and
    that break a rule now (a slot in the year 33658 answered 500 for / and /api/status): both
    answer 200, every entry listed, each broken one with its problem, the others as they are."""
    from celery import Celery
    from celery_anarchon.operate.web import StatusSource, create_app
    from helpers import BROKEN_STORE_ENTRIES, write_broken_entries
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    app = Celery("web_broken", set_as_current=False)
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace, anarchon_store_url=url,
                    beat_schedule={"fine": {"task": "t", "schedule": 60.0},
                                   "text": {"task": "t", "schedule": "every 5 minutes"}})
    store = open_store(url, namespace=namespace, instance_id="older", options={})
    write_broken_entries(store)
    store.close()
    source = StatusSource(app, runs=2)
    try:
        site = create_app(source, token=None, refresh_s=5.0)
        status, _, body = asgi(site, "GET", "/api/status")
        assert status == 200, body[:2000]
        entries = {e["name"]: e for e in json.loads(body)["entries"]}
        for name in ("text", *BROKEN_STORE_ENTRIES):
            assert entries[name]["state"] == "problem" and entries[name]["problem"], name
        assert entries["fine"]["state"] == "running" and entries["fine"]["next"]
        status, _, page = asgi(site, "GET", "/", "per_page=1000")
        assert status == 200, page[:2000]
        assert "in the year 33658" in entries["far"]["problem"] and "in the year 33658" in page
        assert 'data-entry="fine"' in page
    finally:
        source.close()
