"""A backfill with real processes: two ``celery beat`` running an entry of a 1-s interval and a
worker (tests/support/apps/schedules_app.py), on a store the processes share and the sandbox's
Redis as the broker. Once the beats have sent a few slots, the same ``celery anarchon backfill``
is started twice at once, over a range that starts 20 s before the beats did (slots nobody sent)
and ends on a slot the beats sent: each slot of the range is executed exactly once, none twice.

A duplicate can come late (a send of a beat retried until max_late): the verdict is made once the
beats stopped, on what the worker executed plus what the broker still holds."""
from __future__ import annotations

import collections
import sys
import time

import pytest

from celery_anarchon._util import iso

from broker_reads import queued_messages
from cluster import APPS, Cluster
from conftest import REDIS_URL, require_server
from schedules_cluster import SYNC_S, Run, cluster_env, store_in_service
from stores_support import store_url, wait_until

sys.path.insert(0, APPS)
import schedules_app  # noqa: E402,F401  (tests/support/apps: the app the processes run)

#: anarchon_max_late of the beats, seconds
MAX_LATE_S = 5.0
#: the slack of a wait past what the design allows (ticks, the worker, two busy cores); a wait
#: ends as soon as its condition holds, no verdict depends on it
SLACK_S = 30.0
#: how far before the beats' first slot the range starts, seconds
BEFORE_S = 20
BEATS = ("beat-a", "beat-b")
BACKFILLS = ("backfill-a", "backfill-b")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_two_backfills_at_once_over_the_live_schedule_send_each_slot_once(kind, tmp_path,
                                                                          namespace):
    require_server(REDIS_URL, "Redis (the broker)")
    began = time.monotonic()
    url = store_url(kind, str(tmp_path))
    out = str(tmp_path / "executions.jsonl")
    env = cluster_env(kind, url, namespace, out, ANARCHON_SC_SYNC_INTERVAL=str(SYNC_S),
                      ANARCHON_SC_MAX_LATE=str(MAX_LATE_S), ANARCHON_SC_ENTRIES='{"tick": 1}')
    store = store_in_service(kind, url, namespace, ["tick"], 600_000)
    cluster = Cluster(str(tmp_path), env, app="schedules_app")
    run = Run(cluster, out, BEATS)
    try:
        run.start()
        run.wait(lambda: len(run.runs("tick")) >= 3, 10 + SLACK_S, "three slots sent by the beats")
        by_beats = sorted(x["slot"] for x in run.runs("tick"))
        start_ms = by_beats[0] - BEFORE_S * 1000
        end_ms = by_beats[-1]                           # a slot the beats sent
        slots = list(range(start_ms, end_ms + 1, 1000))
        for name in BACKFILLS:                          # the same command, twice at once
            cluster.start(name, "anarchon", "backfill", "tick", "--from", iso(start_ms),
                          "--to", iso(end_ms), "--request-id", "ticket-1", "--rate", "5",
                          "--yes")
        run.phase("start")
        for name in BACKFILLS:
            proc = cluster.procs[name]
            wait_until(lambda: not proc.alive(), 30 + SLACK_S, f"{name} to end")
            assert proc.popen.returncode == 0, proc.text()
        run.phase("backfills")
        reports = {name: cluster.text(name).strip().splitlines() for name in BACKFILLS}
        summary = f"backfill ticket-1 of entry 'tick', {iso(start_ms)} to {iso(end_ms)}: " \
                  f"{len(slots)} slots; sent "
        sent = []
        for name, lines in reports.items():
            line = next(x for x in lines if x.startswith(summary))
            sent.append(int(line[len(summary):].split(",")[0]))
        # the beats sent at least the slots seen before the start; the backfills the rest
        assert sum(sent) <= len(slots) - len(by_beats), reports
        run.wait(lambda: set(slots) <= {x["slot"] for x in run.runs("tick")},
                 10 + SLACK_S, "every slot of the range executed")
        # past max_late after the last slot sent, no beat retries a send of the range: stop
        for name in BEATS:
            cluster.stop(name)
        run.wait(lambda: not queued_messages(f"sc-{namespace}"), 10 + SLACK_S,
                 "the worker to drain the queue")
        run.phase("verdict")
        executed = [x["slot"] for x in run.runs("tick")]
        twice = {s: n for s, n in collections.Counter(executed).items() if n > 1}
        assert not twice, f"executed more than once: {twice}"
        assert set(slots) <= set(executed)
        from_backfills = [x["slot"] for x in run.runs("tick")
                          if x["instance"].startswith("backfill:ticket-1:")]
        assert len(from_backfills) == sum(sent)
        assert min(executed) == start_ms and set(from_backfills) <= set(slots)
        by_beat = {x["slot"] for x in run.runs("tick") if not x["instance"].startswith("backfill:")}
        assert set(by_beats) <= by_beat                 # the range overlaps the live schedule
        print(f"{kind}: {len(slots)} slots, {sum(sent)} sent by the backfills ({sent}), the rest "
              f"by the beats, each executed once; cost {time.monotonic() - began:.1f} s "
              f"({ {k: round(v, 1) for k, v in run.costs.items()} })")
    finally:
        store.close()
        cluster.stop_all()
