"""An entry's end_at with real processes: two ``celery beat`` and a worker on a SQLite store (a
temp dir) and the sandbox's Redis as the broker. A store entry of a 1-s interval whose end_at is
a few seconds ahead: every slot from the sync up to end_at (a slot on it included) is sent
exactly once, none after, and ``status`` then says it ended.

A duplicate or a stray can come late (a claim or a send retried until max_late): the verdict is
made once the beats logged the end and stopped, on what the worker executed plus what the broker
still holds."""
from __future__ import annotations

import collections
import datetime
import math
import sys
import time

import celery_anarchon
from celery_anarchon._util import iso
from celery_anarchon.operate.overview import overview
from celery_anarchon.settings import Settings
from celery_anarchon.stores import open_store

from backends import backdate_memory_start
from broker_reads import queued_messages
from cluster import APPS, Cluster
from conftest import REDIS_URL, require_server
from schedules_cluster import SYNC_S, Run, cluster_env
from stores_support import store_url

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402  (tests/support/apps: the app the processes run)

#: anarchon_max_late of the beats, seconds: a slot is claimed (and sent) up to this late
MAX_LATE_S = 5.0
#: the slack of a wait past what the design allows (ticks, the worker, two busy cores); a wait
#: ends as soon as its condition holds, no verdict depends on it
SLACK_S = 15.0
#: how far ahead of the sync the entry ends, seconds
END_AHEAD_S = 5
BEATS = ("beat-a", "beat-b")


def test_slots_up_to_end_at_are_sent_once_and_none_after(tmp_path, namespace):
    require_server(REDIS_URL, "Redis (the broker)")
    url = store_url("sqlite", str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env("sqlite", url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_SC_MAX_LATE=str(MAX_LATE_S))
    store = open_store(url, namespace=namespace, instance_id="test", options={})
    store.prepare(["ending"])
    backdate_memory_start(store, ["ending"], 120_000)   # a new store refuses its first slots
    app = schedules_app.make_app(env)
    api = celery_anarchon.schedules(app, by="tester@ops")
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    try:
        run.start()

        # on a whole second, so that a slot lies on end_at itself (the bound is included)
        end_ms = (math.ceil(time.time()) + END_AHEAD_S + 2) * 1000
        end_at = datetime.datetime.fromtimestamp(end_ms / 1000, datetime.timezone(
            datetime.timedelta(hours=2)))            # any offset: the same instant
        api.add("ending", task=schedules_app.TASK, schedule=1.0, end_at=end_at)
        synced_ms = run.synced(api.store.entries.entries_version()) * 1000
        assert synced_ms < end_ms - 2000, "the sync took too long for the test to say anything"
        for name in BEATS:
            cluster.wait_log(name, f"entry ending has no more slots: it ended at {iso(end_ms)}",
                             timeout=(end_ms / 1000 - time.time()) + MAX_LATE_S + SLACK_S)
        run.wait(lambda: any(x["slot"] == end_ms for x in run.runs("ending")),
                 MAX_LATE_S + SLACK_S, "the run of the slot on end_at")
        state = {e["name"]: e for e in overview(app, api.store, Settings.from_app(app),
                                                runs=5)["entries"]}["ending"]
        assert state["state"] == "ended" and state["next"] == []
        assert state["end_at"] == iso(end_ms) and state["start_at"] is None
        # past max_late after end_at no beat could claim a slot of it any more: stop and count
        run.wait(lambda: time.time() * 1000 > end_ms + MAX_LATE_S * 1000 + 1000,
                 MAX_LATE_S + 2, "max_late past end_at")
        for name in BEATS:
            cluster.stop(name)
        stray = [h for h in queued_messages(f"sc-{namespace}")
                 if h.get("anarchon_entry") == "ending"]
        slots = [x["slot"] for x in run.runs("ending")] + [h["anarchon_slot"] for h in stray]
        twice = {s: n for s, n in collections.Counter(slots).items() if n > 1}
        assert not twice, f"sent more than once: {twice}"
        assert max(slots) == end_ms, "a slot after end_at was sent"
        first = (int(synced_ms) // 1000 + 1) * 1000
        missing = sorted(set(range(first, end_ms + 1, 1000)) - set(slots))
        assert not missing, f"slots up to end_at not sent: {missing}"
        print(f"{len(slots)} slots sent once each, the last on end_at; none after")
    finally:
        api.close()
        store.close()
        cluster.stop_all()
