"""The status page's entry page (``GET /entries/<name>``, ``GET /api/entries/<name>``): an entry's
definition and where it comes from, who changed it last, its history a page at a time, its next
slots in its zone, its lease, its runs' task ids linked to Flower only when
``anarchon_flower_url`` is set; an unknown name answers 404 naming it; a hostile name is text
everywhere and works in the path. The page is the Starlette app in this process on an SQLite
store; the browser test serves it with uvicorn and reads it with headless chromium at 1024 and
1400 px (no sideways scroll). Its screenshot is docs/status-entry-page.png: written when the file
is missing or ``ANARCHON_UPDATE_SCREENSHOT=1`` (every run's copy is in the test's tmp dir).
"""
from __future__ import annotations

import contextlib
import html
import json
import re
import threading
import time
import urllib.parse

from celery import Celery

import celery_anarchon
from celery_anarchon.operate.web import LOOPBACK_NAMES, StatusSource, create_app
from celery_anarchon.stores import ClaimRequest, LeaseTerms, open_store
from celery_anarchon.stores.base import RunEvent

from backends import backdate_memory_start
from operate_support import asgi, free_port
from paths import DOCS
from stores_support import wait_until
from web_browser import browser, keep_screenshot, sideways, viewport  # noqa: F401  (fixture)

SCREENSHOT = DOCS / "status-entry-page.png"
T0_MS = 1_780_000_020_000          # a slot of the written history (2026-05-28)
#: a beat_schedule name with markup, a slash, a line break, quotes and non-ASCII letters
HOSTILE = '</td><script>alert(1)</script> a/b\n"ü\'s'
FLOWER = "https://flower.example:5555"


def _app(tmp_path, namespace: str, **conf) -> Celery:
    app = Celery("web_entry", set_as_current=False)
    app.conf.update(
        broker_url="memory://", anarchon_namespace=namespace, timezone="Europe/Paris",
        anarchon_store_url=f"sqlite:///{tmp_path / 'store.sqlite3'}",
        beat_schedule={
            "report": {"task": "proj.report", "schedule": 60.0, "args": [7, "<b>bold</b>"],
                       "kwargs": {"to": "ops@example.com"},
                       "options": {"queue": "reports", "anarchon": {"max_late": 30}}},
            HOSTILE: {"task": "proj.hostile", "schedule": 120.0}},
        **conf)
    return app


def _write_runs(store, name: str, count: int) -> list[int]:
    """``count`` sent runs of ``name``, a minute apart from :data:`T0_MS`; their slots."""
    slots = [T0_MS + i * 60_000 for i in range(count)]
    for i, slot in enumerate(slots):
        store.history.record(name, slot, RunEvent.SENT, task_id=f"task {i}/x")
    return slots


@contextlib.contextmanager
def _site(app, **kwargs):
    source = StatusSource(app, runs=5)
    try:
        yield create_app(source, **kwargs), source.store
    finally:
        source.close()


def _json(site, name: str, query: str = "") -> tuple[int, dict]:
    status, headers, body = asgi(site, "GET", "/api/entries/" + name, query)
    assert headers["content-type"] == "application/json", headers
    return status, json.loads(body)


def test_the_entry_page_shows_the_definition_and_pages_the_whole_history(tmp_path, namespace):
    with _site(_app(tmp_path, namespace)) as (site, store):
        store.prepare(["report"])
        slots = _write_runs(store, "report", 120)
        kept = sorted(slots, reverse=True)[:100]      # the store keeps the newest history_size
        status, data = _json(site, "report", "limit=40")
        assert status == 200, data
        assert data["source"] == "config" and data["definition"]["task"] == "proj.report"
        assert data["definition"]["args"] == [7, "<b>bold</b>"]
        assert data["definition"]["kwargs"] == {"to": "ops@example.com"}
        assert data["queue"] == "reports" and data["definition"]["anarchon"] == {"max_late": 30}
        assert data["changed"] is None and data["timezone"] == "Europe/Paris"
        assert len(data["next"]) == 10 and data["next"][0]["local"].endswith(("CET", "CEST"))
        assert data["history"]["kept"] == 100 and data["history"]["history_size"] == 100
        seen, query, pages = [], "limit=40", []
        while True:
            status, data = _json(site, "report", query)
            page = [r["slot"] for r in data["history"]["runs"]]
            pages.append(len(page))
            seen += page
            if data["history"]["next_before"] is None:
                break
            query = f"limit=40&before={data['history']['next_before']}"
        assert pages == [40, 40, 20]
        from celery_anarchon._util import iso
        assert seen == [iso(s) for s in kept], "newest first, each kept run once"
        assert all(r["flower"] is None for r in data["history"]["runs"])

        status, _, page = asgi(site, "GET", "/entries/report", "limit=40")
        assert status == 200
        assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page
        assert 'id="queue">reports<' in page and "beat_schedule (this app" in page
        older = re.search(r'id="older-page" href="([^"]+)"', page)[1]
        assert html.unescape(older) == f"?limit=40&before={kept[39]}"
        assert 'id="newest-page"' not in page and "/task/" not in page
        assert "set anarchon_flower_url to link task ids to Flower" in page
        status, _, last = asgi(site, "GET", "/entries/report", f"limit=40&before={kept[79]}")
        assert 'id="older-page"' not in last and 'id="newest-page" href="?limit=40"' in last
        assert last.count('class="run-row"') == 20
        for query, size in (("limit=0", 1), ("limit=x", 50), ("limit=99999", 100)):
            assert len(_json(site, "report", query)[1]["history"]["runs"]) == size, query


def test_task_ids_link_to_flower_only_when_the_setting_is_set(tmp_path, namespace):
    with _site(_app(tmp_path, namespace, anarchon_flower_url=FLOWER + "/")) as (site, store):
        store.prepare(["report"])
        _write_runs(store, "report", 3)
        status, data = _json(site, "report")
        assert data["flower_url"] == FLOWER
        assert data["history"]["runs"][0]["flower"] == f"{FLOWER}/task/task%202%2Fx"
        status, _, page = asgi(site, "GET", "/entries/report")
        assert page.count(f'href="{FLOWER}/task/task%20') == 3, page
        assert 'rel="noreferrer noopener"' in page and "set anarchon_flower_url" not in page


def test_an_unknown_entry_is_a_404_naming_it_and_a_hostile_name_is_text_everywhere(
        tmp_path, namespace):
    app = _app(tmp_path, namespace)
    with _site(app, allowed_hosts=[*LOOPBACK_NAMES]) as (site, store):
        store.prepare([HOSTILE])
        store.history.record(HOSTILE, T0_MS, RunEvent.LATE, detail="<img src=x onerror=alert(1)>")
        with celery_anarchon.schedules(app, store=store, by="ops <ops@example.com>") as api:
            api.add('<i>nightly</i> & "report"', task="proj.nightly", schedule=3600.0)

        unknown = "<b>no-such</b>/entry"
        status, _, page = asgi(site, "GET", "/entries/" + unknown)
        assert status == 404 and "&lt;b&gt;no-such&lt;/b&gt;/entry" in page
        assert "<b>no-such</b>" not in page and "no entry" in page
        status, data = _json(site, unknown)
        assert status == 404 and unknown in data["error"]

        # the main page links the name; the link leads back to it, through every character
        status, _, main = asgi(site, "GET", "/", "per_page=1000")
        links = {html.unescape(h) for h in re.findall(r'href="(/entries/[^"]+)"', main)}
        hostile = "/entries/" + urllib.parse.quote(HOSTILE, safe="")
        assert hostile in links, links
        path = urllib.parse.unquote(hostile)          # the server's decoded path
        status, headers, page = asgi(site, "GET", path)
        assert status == 200, page[:2000]
        assert "<script>" not in page and "<img" not in page
        assert "&lt;/td&gt;&lt;script&gt;alert(1)&lt;/script&gt; a/b\n&#34;ü&#39;s" in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "script-src 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert _json(site, HOSTILE)[1]["name"] == HOSTILE
        assert asgi(site, "GET", path, headers={"Host": "attacker.example"})[0] == 400

        # a store entry: who changed it last
        nightly = '<i>nightly</i> & "report"'
        status, data = _json(site, nightly)
        assert data["source"] == "store" and data["changed"]["by"] == "ops <ops@example.com>"
        status, _, page = asgi(site, "GET", "/entries/" + nightly)
        assert "by <b>ops &lt;ops@example.com&gt;</b>" in page and "<i>nightly</i>" not in page


def test_an_entry_only_live_beat_instances_run_is_shown_as_they_record_it(tmp_path, namespace):
    """A django-celery-beat row (or another host's beat_schedule entry): neither this app's
    beat_schedule nor a store entry; a live instance records its fingerprint and definition."""
    from celery_anarchon.stores.entry_store import InstanceRecord
    with _site(_app(tmp_path, namespace)) as (site, store):
        store.prepare(["row-entry"])
        now = store.now_ms()
        text = json.dumps({"task": "dj.cleanup", "schedule": "every 600 s", "timing": {}})
        store.history.save_definition("row-entry", "ffff00001111", text)
        store.instances.save_fingerprints("d-row", {"row-entry": "ffff00001111"})
        store.instances.record_instance(InstanceRecord("dj-host:77:aa", "dj-host", 77, "0.1.0",
                                                       now - 60_000, now, 0, 1, "d-row"),
                                        ttl_ms=600_000)
        status, data = _json(site, "row-entry")
        assert status == 200, data
        assert data["source"] == "instances" and data["run_by"] == ["dj-host:77"]
        assert data["definition"]["task"] == "dj.cleanup"
        assert "django-celery-beat" in data["source_text"]
        status, _, page = asgi(site, "GET", "/entries/row-entry")
        assert status == 200 and "dj-host:77" in page and 'id="task">dj.cleanup<' in page


def test_a_broken_store_entry_has_its_page_with_its_problem(tmp_path, namespace):
    """Store entries an older version wrote, and one written straight into the store with NaN in
    its kwargs (not JSON: it answered 500 for /api/entries/<name>): each page answers 200 with
    the entry's problem, the part that is no JSON shown by its repr."""
    from helpers import BROKEN_STORE_ENTRIES, write_broken_entries
    with _site(_app(tmp_path, namespace)) as (site, store):
        write_broken_entries(store)
        store.entries.put_entry("nan", '{"kwargs":{"x":NaN},"schedule":{"every":60},"task":"t"}',
                                by="a hand edit", create=True)
        for name in (*BROKEN_STORE_ENTRIES, "nan"):
            status, data = _json(site, name)
            assert status == 200 and data["state"] == "problem" and data["problem"], (name, data)
            assert asgi(site, "GET", "/entries/" + name)[0] == 200, name
        assert _json(site, "nan")[1]["definition"]["kwargs"] == {"repr": "{'x': nan}"}


def test_a_next_slot_is_shown_in_the_entry_zone_else_in_utc():
    from celery_anarchon.operate.times import zone_time
    t = "2026-07-01T10:00:00.000+00:00"
    assert zone_time(t, "Europe/Paris") == "2026-07-01 12:00:00 CEST"
    assert zone_time(t, "UTC") == zone_time(t, "No/Such_zone") == "2026-07-01 10:00:00 UTC"
    assert zone_time("9999-12-31T23:30:00+00:00", "Pacific/Kiritimati") == "9999-12-31 23:30:00 UTC"
    assert zone_time("no instant", "Europe/Paris") == "no instant"


@contextlib.contextmanager
def _served(site):
    """The page on a free port of 127.0.0.1 (uvicorn in a thread of this process)."""
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(site, host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the page's server", interval=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def _leased_app(tmp_path, namespace: str) -> Celery:
    app = _app(tmp_path, namespace, anarchon_flower_url=FLOWER)
    app.conf.beat_schedule["billing.invoices"] = {
        "task": "proj.billing.send_invoices", "schedule": 300.0,
        "args": ["EU", 2026], "kwargs": {"dry_run": False, "batch": 500},
        "options": {"queue": "billing", "priority": 5,
                    "anarchon": {"lease": {"duration": 120, "heartbeat": 20}, "max_late": 45}}}
    celery_anarchon.install(app)
    return app


def _lease_and_history(page_store, name: str) -> None:
    """A live lease of ``name``'s current slot (claimed by a beat, adopted by a worker) and ten
    hours of runs before it (every 5 minutes), some late, one a second attempt."""
    store = open_store(page_store.url, namespace=page_store.namespace,
                       instance_id="host-a:4121:9f3c2e")
    try:
        _write_lease_and_history(store, name)
    finally:
        store.close()


def _write_lease_and_history(store, name: str) -> None:
    now = store.now_ms()
    slot = now - now % 300_000
    backdate_memory_start(store, [name], 11 * 3600_000)
    for i in range(1, 121):
        s = slot - i * 300_000
        if i % 17 == 0:
            store.history.record(name, s, RunEvent.LATE, detail="claimed 52.1 s after its slot, "
                                 "more than max_late 45 s: skipped")
        else:
            store.history.record(name, s, RunEvent.FINISHED, task_id=f"anarchon-{s}-{i:04d}-1",
                                 attempt=2 if i == 5 else 1)
    store.claim([ClaimRequest(name, slot, max_late_ms=600_000, task_id=f"anarchon-{slot}-1",
                              lease=LeaseTerms(queue_timeout_ms=60_000))])
    store.leases.adopt(name, slot, "worker-1@host-b:4242", 120_000)


def test_the_entry_page_fits_1024_and_1400_px_in_chromium(browser, tmp_path, namespace):
    from selenium.webdriver.common.by import By
    began = time.monotonic()
    app = _leased_app(tmp_path, namespace)
    with _site(app, allowed_hosts=[*LOOPBACK_NAMES]) as (site, store), _served(site) as base:
        store.prepare(["billing.invoices", HOSTILE])
        _lease_and_history(store, "billing.invoices")
        for width in (1024, 1400):
            viewport(browser, width, 900)
            browser.get(base + "/?refresh=0&q=billing")
            link = browser.find_element(By.CSS_SELECTOR, "tr.entry .entry-name a")
            assert link.text == "billing.invoices"
            link.click()
            wait_until(lambda: browser.find_elements(By.ID, "history"), 10, "the entry page")
            assert browser.find_element(By.ID, "entry-name").text == "billing.invoices"
            assert "holder worker-1@host-b:4242" in browser.find_element(By.ID, "lease").text
            assert browser.find_element(By.ID, "queue").text == "billing"
            flower = browser.find_elements(By.CSS_SELECTOR, f"#history a[href^='{FLOWER}/task/']")
            assert len(flower) >= 40, len(flower)
            assert browser.find_element(By.ID, "older-page")
            scroll, client = sideways(browser)
            assert scroll <= client, f"sideways scroll at {width} px: {scroll} > {client}"
            if width == 1400:
                keep_screenshot(browser, tmp_path, SCREENSHOT)
        # the hostile name's link from the main page opens its page, the name as text
        browser.get(base + "/?refresh=0&per_page=1000")
        (link,) = [a for a in browser.find_elements(By.CSS_SELECTOR, "tr.entry .entry-name a")
                   if a.text.startswith("</td>")]
        link.click()
        wait_until(lambda: browser.find_elements(By.ID, "definition"), 10, "the hostile entry")
        shown = browser.find_element(By.ID, "entry-name").text
        assert shown == HOSTILE.replace("\n", " "), shown
        assert browser.find_element(By.ID, "task").text == "proj.hostile"
    print(f"entry page browser test: {time.monotonic() - began:.1f} s")
