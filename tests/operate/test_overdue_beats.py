"""Overdue with real beats (multi-process, a real SQLite store): a beat runs an entry every
second and is stopped; ``status --json`` and ``check --overdue`` (``celery -A operate_app
anarchon``, subprocesses) show the entry overdue within its jitter + max_late (plus a margin of
the settings), and a beat started again clears it."""
from __future__ import annotations

import json
import time

from celery_anarchon.operate.overview import overview
from celery_anarchon.settings import Settings
from celery_anarchon.stores import open_store

from backends import BACKENDS
from cluster import Cluster
from operate_support import exits, operate
from paths import APPS
from stores_support import wait_until

SYNC_S = 1.0   # anarchon_sync_interval: a stopped beat's record is stale after 2 of them


def test_a_stopped_beat_leaves_its_entry_overdue_and_a_started_one_clears_it(
        tmp_path, namespace, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    env = {"ANARCHON_OP_STORE": url, "ANARCHON_OP_NAMESPACE": namespace,
           "ANARCHON_OP_SCHEDULE": "overdue", "ANARCHON_OP_SYNC": str(SYNC_S)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(APPS))
    import operate_app
    app = operate_app.app
    app.conf.update(anarchon_store_url=url, anarchon_namespace=namespace,
                    anarchon_sync_interval=SYNC_S,
                    beat_schedule=operate_app.SCHEDULES["overdue"])   # imported already, maybe
    settings = Settings.from_app(app)
    cluster = Cluster(str(tmp_path), env, app="operate_app")
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    started = time.monotonic()
    check = lambda: operate(url, namespace, "overdue", "check", "--overdue")  # noqa: E731
    exits(check(), 0)                        # nothing ran yet: nothing to vouch for
    # the margin: what a command takes to start here, and two sync intervals
    margin_s = time.monotonic() - started + 2 * SYNC_S
    refused = operate(url, namespace, "overdue", "check", "--overdue", "--no-store")
    assert refused.returncode == 2 and "cannot go with --no-store" in refused.stderr

    def row() -> dict:
        data = overview(app, store, settings, runs=3)
        return {e["name"]: e for e in data["entries"]}["every-1s"]
    try:
        store.prepare(["every-1s"])
        [sqlite] = [b for b in BACKENDS if b.kind == "sqlite"]
        sqlite.backdate(store, ["every-1s"], 3_600_000)   # a brand-new store refuses older slots
        cluster.beat("beat")
        plan_s = 1.0 + 0.2 + 2.0                   # the gap, jitter and max_late of every-1s
        # the beat's start (its process, the store) is not an overdue matter: a minute to run
        wait_until(lambda: (r := row())["due"] and r["due"]["state"] == "recorded"
                   and r["unsent"] is False, 60, "a run of every-1s recorded", interval=0.1)
        assert row()["state"] == "running"
        cluster.stop("beat")
        stopped = time.monotonic()
        wait_until(lambda: row()["state"] == "overdue", plan_s + margin_s, "every-1s overdue",
                   interval=0.1)
        print(f"overdue {time.monotonic() - stopped:.1f} s after the beat stopped")
        done = check()
        assert done.returncode == 5, (done.stdout, done.stderr)
        assert "OVERDUE  every-1s: its newest due slot " in done.stdout
        assert "past its deadline" in done.stdout
        assert done.stdout.splitlines()[-1] == "check --overdue: 1 entry overdue (2 entries, 2 warnings)"
        data = json.loads(exits(operate(url, namespace, "overdue", "status", "--json"), 0))
        [entry] = [e for e in data["entries"] if e["name"] == "every-1s"]
        assert entry["state"] == "overdue" and entry["due"]["late_s"] > 0
        assert entry["unsent"] is True and not any(i["ticking"] for i in data["instances"])
        text = exits(operate(url, namespace, "overdue", "status"), 0)
        assert "overdue; nothing sends it (no live beat)" in text
        assert "overdue entries: 1\n  every-1s: its newest due slot" in text

        cluster.beat("beat-again")
        again = time.monotonic()
        wait_until(lambda: row()["state"] == "running", 60 + plan_s + margin_s,
                   "every-1s running again", interval=0.1)
        print(f"running again {time.monotonic() - again:.1f} s after a beat started")
        assert check().returncode == 0
    finally:
        store.close()
        cluster.stop_all()

