"""The status page's main view in Chromium at 1024 and 1400 px wide: what needs attention, the
strip's marks, relative times and the layout.

A real SQLite store holds what an operator's page shows: two live beat instances (their records
written through the store's instance API) that disagree on one entry's definition, a run of a
leased entry really taken over (claimed, adopted by a worker whose lease runs out, taken over
through the store's lease API, adopted again), a failed send, a pause and a new store's first
refused slot (written through the history API), a crontab in the app's zone Europe/Paris and a long
entry name. The page is the page's ASGI app served by uvicorn in this process, with actions
allowed (the buttons' column shown).

At both widths: the page does not scroll sideways, the lease and action columns are in view,
the crontab expression is one line and its zone is named once; the takeover, the failed send, the
pause and the disagreement are in "Need attention" and the new store's refusal is not; the
strip marks the takeover and the failed send; times are relative ("12 s ago") with the whole
instant in their tooltip, right against the store's clock when served and still right as the
script moves them on and as the page reloads itself. Screenshots: docs/status-page-1024.png and
docs/status-page-1400.png (written when missing or with ``ANARCHON_UPDATE_SCREENSHOT=1``).
"""
from __future__ import annotations

import re
import threading

import pytest

import celery_anarchon
from celery_anarchon._util import iso
from celery_anarchon.stores import open_store
from celery_anarchon.stores.base import ClaimRequest, LeaseTerms, Outcome, RunEvent, TakeoverOutcome
from celery_anarchon.stores.entry_store import InstanceRecord, Pause

from backends import backdate_memory_start
from operate_support import free_port, http
from paths import DOCS
from stores_support import store_url, wait_until
from web_browser import browser, keep_screenshot, sideways, viewport  # noqa: F401  (fixture)

ZONE = "Europe/Paris"
TOKEN = "t0ken-for-the-layout-test-" + "x" * 8
#: the entries: name -> (task, period in seconds); the crontab's period is its */2 minutes
LONG = "reports.customer_invoices_monthly_reconciliation_for_every_region"
PERIODS = {"nightly-report": 120, "invoice-sync": 60, "mail-digest": 30, "cleanup": 300,
           LONG: 600}
#: max_late, s: no slot of the test's entries turns overdue while it runs
MAX_LATE_S = 600
#: the runs written before now cover this much of each entry's past, s: past its newest due
#: slot (slot + jitter + max_late before now), so that none is overdue
COVERED_S = MAX_LATE_S + 300


def _app(url: str, namespace: str):
    from celery import Celery
    from celery.schedules import crontab
    app = Celery("web_layout", set_as_current=False)
    schedule = {name: {"task": f"tasks.{name.split('.')[0].replace('-', '_')}", "schedule": float(s)}
                for name, s in PERIODS.items()}
    schedule["nightly-report"]["schedule"] = crontab(minute="*/2")
    schedule["invoice-sync"]["options"] = {"anarchon": {"lease": True}}
    app.conf.update(broker_url="memory://", anarchon_namespace=namespace,
                    anarchon_store_url=url, timezone=ZONE, anarchon_max_late=MAX_LATE_S,
                    result_expires=None, beat_schedule=schedule)
    celery_anarchon.install(app)   # as the app module does: invoice-sync is leased
    return app


def _instances(store, now_ms: int) -> None:
    """Two live beats (their heartbeats now), which disagree on nightly-report's definition."""
    same = {name: f"fp-{i}" for i, name in enumerate(PERIODS)}
    for n, (digest, fingerprints) in enumerate((("digest-a", same),
                                                ("digest-b", {**same, "nightly-report": "fp-b"}))):
        store.instances.save_fingerprints(digest, fingerprints)
        store.instances.record_instance(InstanceRecord(
            instance_id=f"web-{n + 1}-4242-{digest[-1] * 6}", host=f"web-{n + 1}", pid=4242,
            version="test", started_ms=now_ms - 3_600_000, last_tick_ms=now_ms, skew_ms=0,
            entries=len(PERIODS), fingerprints_digest=digest), 600_000)


def _history(store, now_ms: int) -> None:
    """Each entry's runs of the last slots, sent (leased: finished); mail-digest's newest send
    failed; the long entry's oldest slot a new store's first refusal."""
    for name, period in PERIODS.items():
        step = period * 1000
        slots = [now_ms // step * step - i * step for i in range(COVERED_S // period + 1)]
        done = RunEvent.FINISHED if name == "invoice-sync" else RunEvent.SENT
        for slot in reversed(slots):
            store.history.record(name, slot, done, task_id=f"task-{name}-{slot}")
        if name == "mail-digest":
            store.history.record(name, slots[0], RunEvent.SEND_FAILED, task_id="task-failed",
                                 detail="the broker refused the connection until max_late")
        if name == LONG:
            began = iso(slots[-1] - step + 1_000)   # after the refused slot, before the others
            store.history.record(name, slots[-1] - step, RunEvent.FORGOTTEN,
                                 detail=f"the store's memory began at {began}")


def _takeover(url: str, namespace: str, store) -> int:
    """A real takeover of invoice-sync's run now: beat A claims it, a worker adopts it with a
    200 ms lease and dies (never renews), beat B takes the expired run over, a second worker
    adopts the new attempt. Returns the run's slot."""
    slot = store.now_ms() + 1
    claim = ClaimRequest(entry="invoice-sync", slot_ms=slot, max_late_ms=MAX_LATE_S * 1000,
                         task_id="task-first", fingerprint="fp-1",
                         lease=LeaseTerms(queue_timeout_ms=60_000))
    assert store.claim([claim])[0].outcome is Outcome.WON
    others = [open_store(url, namespace=namespace, instance_id=who) for who in ("worker-1", "beat-b")]
    try:
        worker, beat_b = others
        adopted, first = worker.leases.adopt("invoice-sync", slot, "worker-1", 200)
        assert adopted, first
        dead = wait_until(lambda: [r for r in beat_b.leases.expired_runs(["invoice-sync"])
                                   if r.slot_ms == slot], 10, "the worker's lease to run out")[0]
        outcome, _ = beat_b.leases.take_over("invoice-sync", slot, dead.token,
                                             queue_timeout_ms=60_000, max_attempts=3,
                                             task_id="task-second")
        assert outcome is TakeoverOutcome.TAKEN, outcome
        assert worker.leases.adopt("invoice-sync", slot, "worker-2", 600_000)[0]
    finally:
        for other in others:
            other.close()
    return slot


@pytest.fixture
def page(tmp_path, namespace):
    """The store of the module docstring and its page: ``(base URL, store, takeover slot)``."""
    import uvicorn
    from celery_anarchon.operate.web import StatusSource, create_app
    url = store_url("sqlite", str(tmp_path))
    store = open_store(url, namespace=namespace, instance_id="beat-a")
    store.prepare(list(PERIODS))
    backdate_memory_start(store, list(PERIODS), 2 * (COVERED_S + max(PERIODS.values())) * 1000)
    now_ms = store.now_ms()
    _history(store, now_ms)
    store.entries.set_pause("cleanup", Pause("disk migration <b>", "ops@web-1", 0), by="ops@web-1")
    slot = _takeover(url, namespace, store)
    _instances(store, store.now_ms())
    source = StatusSource(_app(url, namespace))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(source, token=TOKEN, refresh_s=1.0),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started, 20, "the page to listen")
        yield base, store, slot
    finally:
        server.should_exit = True
        thread.join(20)
        source.close()
        store.close()


#: what the page's script reads of the layout: sideways scroll, the lease and action columns in
#: view, the crontab expression's lines
LAYOUT = """
var d = document.documentElement, out = {scroll: d.scrollWidth, client: d.clientWidth, outside: []};
document.querySelectorAll("#entries td.lease, #entries td.buttons, #entries th").forEach(function (c) {
  var r = c.getBoundingClientRect();
  if (r.left < 0 || r.right > d.clientWidth || r.width === 0) out.outside.push(c.className || c.textContent);
});
out.exprLines = Array.prototype.map.call(document.querySelectorAll("#entries .expr"),
  function (e) { return e.getClientRects().length; });
return out;"""


def _row(driver, name: str):
    from selenium.webdriver.common.by import By
    return next(r for r in driver.find_elements(By.CSS_SELECTOR, "tr.entry")
                if r.get_attribute("data-entry") == name)


def _seconds_ago(text: str) -> int:
    found = re.fullmatch(r"(\d+) s ago", text)
    assert found, text
    return int(found.group(1))


def _takeover_time(driver):
    from selenium.webdriver.common.by import By
    return _row(driver, "invoice-sync").find_element(By.CSS_SELECTOR, "td.last time")


def _right_against_the_store(driver, store, slot: int) -> int:
    """The takeover run's "N s ago" (its slot): N is the store's clock minus the slot, within a
    second and the page's read."""
    before = store.now_ms()
    shown = _seconds_ago(_takeover_time(driver).text)
    after = store.now_ms()
    assert (before - slot) / 1000 - 1.5 <= shown <= (after - slot) / 1000 + 1.5, (shown, before, after)
    return shown


@pytest.mark.parametrize("width", [1024, 1400])
def test_the_main_page_fits_its_width_and_shows_a_takeover_in_attention(browser, page, tmp_path,
                                                                        width):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    base, store, slot = page
    viewport(browser, width, 900)
    _instances(store, store.now_ms())   # ticking beats as the page reads them
    browser.get(base + "/?refresh=0")
    assert http(base + "/?refresh=0")[0] == 200

    # need attention: something to do; a new store's first refusal is not
    needing = {li.get_attribute("data-entry"): li.text for li in
               browser.find_elements(By.CSS_SELECTOR, "#attention li.attention-item")}
    assert needing == {"invoice-sync": "invoice-sync: taken over",
                       "mail-digest": "mail-digest: send failed",
                       "cleanup": "cleanup: paused",
                       "nightly-report": "nightly-report: definitions disagree"}, needing
    assert "taken over" in _row(browser, "invoice-sync").find_element(By.CSS_SELECTOR, "td").text
    assert "attention" not in _row(browser, LONG).get_attribute("class")
    assert _row(browser, LONG).find_elements(By.CSS_SELECTOR, '.strip .run.skip[data-event="forgotten"]')
    # the strip: the takeover and the failed send in their own colours
    # (the run taken over is started again: its colour, and the takeover's orange top)
    taken = _row(browser, "invoice-sync").find_elements(By.CSS_SELECTOR, ".strip .run.taken")
    assert len(taken) == 1 and "busy" in taken[0].get_attribute("class")
    assert "before: attempt 1 started by" in taken[0].get_attribute("title")
    assert "before: attempt 2 taken_over by" in taken[0].get_attribute("title")
    assert len(_row(browser, "mail-digest").find_elements(By.CSS_SELECTOR, ".strip .run.send-failed")) == 1
    legend = browser.find_element(By.ID, "legend").text
    assert "taken over" in legend and "send failed" in legend

    # the layout: no sideways scroll, the lease and action columns in view, one-line crontab
    layout = browser.execute_script(LAYOUT)
    assert layout["scroll"] <= layout["client"] == width, layout
    assert not layout["outside"] and layout["exprLines"] == [1] * len(PERIODS), layout
    assert sideways(browser)[0] <= width
    cron = _row(browser, "nightly-report")
    schedule = cron.find_element(By.CSS_SELECTOR, "td.schedule")
    assert schedule.text.count(ZONE) == 1 and "crontab */2 * * * *" in schedule.text, schedule.text
    lease = _row(browser, "invoice-sync").find_element(By.CSS_SELECTOR, "td.lease").text
    assert lease.startswith("started · attempt 2\nholder worker-2\ntoken "), lease

    # relative times, the whole instant in the tooltip (in the entry's zone and UTC)
    upcoming = cron.find_elements(By.CSS_SELECTOR, "td.next time")
    assert len(upcoming) == 3 and all(re.fullmatch(r"in \d+ (s|min)", t.text) for t in upcoming)
    title = upcoming[0].get_attribute("title")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:00 CES?T \(Europe/Paris\) · "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:00 UTC", title), title
    first = _right_against_the_store(browser, store, slot)
    # moved on by the script, with no reload: still right
    WebDriverWait(browser, 10).until(lambda d: _seconds_ago(_takeover_time(d).text) >= first + 2)
    _right_against_the_store(browser, store, slot)
    keep_screenshot(browser, tmp_path, DOCS / f"status-page-{width}.png")

    # the page reloading itself every second: its new rows' times are right too
    browser.get(base + "/?refresh=1")
    browser.execute_script("document.getElementById('status').dataset.old = '1';")
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(
        "return !document.getElementById('status').dataset.old;"))
    _right_against_the_store(browser, store, slot)
    layout = browser.execute_script(LAYOUT)
    assert layout["scroll"] <= layout["client"] and not layout["outside"], layout


def _run(event: str, **more) -> dict:
    return {"slot": "2026-03-29T01:00:00+00:00", "event": event, "at": None, "instance": "A",
            "attempt": 1, "task_id": "t", "detail": "", "earlier": [], **more}


def test_attention_is_something_to_do_and_a_new_stores_first_refusal_is_not():
    from celery_anarchon.operate.page import attention, run_classes
    running = {"name": "e", "state": "running", "paused": None, "problem": None, "lease": None,
               "kept": [], "runs": [_run("sent")]}
    assert attention(running) is None
    first = {**running, "runs": [_run("sent"), _run("forgotten", new_store=True)]}
    assert attention(first) is None, "a new store's first refusal"
    assert attention({**running, "runs": [_run("forgotten")]}) == "forgotten", "a store that forgot"
    taken = _run("started", attempt=2, earlier=[_run("started"), _run("taken_over", attempt=2)])
    for runs, why in (([_run("taken_over", attempt=2)], "taken over"), ([taken], "taken over"),
                      ([_run("sent"), _run("send_failed")], "send failed"),
                      ([_run("given_up")], "given_up"), ([_run("missed")], "missed")):
        assert attention({**running, "runs": runs}) == why, (runs, why)
    assert attention(running, disagreeing={"e"}) == "definitions disagree"
    assert attention({**running, "kept": [{"instance": "h:1", "what": "entry", "detail": ""}]}) \
        == "store lost data"
    assert attention({**running, "paused": {"by": "ops"}, "runs": [taken]}) == "paused"
    assert run_classes(taken) == "busy taken" and run_classes(_run("taken_over")) == "takeover"
    assert run_classes(_run("send_failed")) == "send-failed" and run_classes(_run("x")) == "other"


def test_a_time_is_relative_with_the_whole_instant_in_its_tooltip_every_value_escaped():
    from celery_anarchon.operate.page import schedule_parts, time_tag
    from celery_anarchon.operate.times import absolute, relative
    t, now = "2026-07-01T10:00:00.000+00:00", 1782900000000   # 10:00:00 UTC
    tag = str(time_tag(t, "Europe/Paris", now_ms=now + 12_400))
    assert tag == ('<time class="ago" datetime="2026-07-01T10:00:00.000+00:00" data-ms="1782900000000" '
                   'title="2026-07-01 12:00:00 CEST (Europe/Paris) · 2026-07-01 10:00:00 UTC">'
                   '12 s ago</time>'), tag
    assert relative(t, now - 180_000) == "in 3 min" and relative(t, now + 2.5 * 86_400_000) == "2 d ago"
    assert relative(t, now - 89_400) == "in 89 s" and relative(t, now - 90_000) == "in 2 min"
    assert absolute(t, '<b>"x"</b>') == "2026-07-01 10:00:00 UTC", "an unknown zone left out"
    assert absolute("9999-12-31T23:30:00+00:00", "Pacific/Kiritimati") == "9999-12-31 23:30:00 UTC"
    assert str(time_tag('<b>"x"</b>', now_ms=now)) == "&lt;b&gt;&#34;x&#34;&lt;/b&gt;"
    assert str(time_tag(None, now_ms=now)) == ""
    cron = {"schedule": "crontab */2 * * * * Europe/Paris", "timezone": "Europe/Paris"}
    assert schedule_parts(cron) == ("crontab */2 * * * *", "Europe/Paris")
    assert schedule_parts({"schedule": "every 60 s", "timezone": None}) == ("every 60 s", None)
