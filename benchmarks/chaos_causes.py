"""Which injected fault explains which missed run: the chaos verdict's rule
(benchmarks/chaos_analysis.py), by the fault's kind, target and time.

A miss reason (a history record's event or a log line's, e.g. ``send_failed``) explains a run
that did not run only when an injected fault that can cause that reason (:data:`CAUSES`)

* was on around the run's slot: the slot lies from ``before`` seconds before the fault started
  to ``after`` seconds after it ended (:func:`window`, by reason). A fault can only touch a run
  that was still being claimed or sent when the fault began, and whose slot came before the
  fault ended, plus the time the beats and the store take to get over it;
* and, for a fault of one beat (:data:`ONE_BEAT`: a kill, a pause, the clock skew), when that
  beat itself recorded the reason (its history record's instance, or a line of its log): a
  paused beat-5 skips its own runs as late and fails its own sends, never another beat's. The
  reasons of leased runs are the exception (:data:`LEASE_REASONS`): a run held up by one beat
  (won, then killed before its send) makes the next slot overlap on whichever beat claims it.

The figures come from the chaos run's timing (chaos.py: max_late 15 s, the store's 10 s lateness
tolerance, one beat 5 s off, leases of 6 s with 1 s heartbeats, 10 s queue timeouts and 3
attempts) and from the runs of docs/reliability.md.
"""
from __future__ import annotations

import collections

#: which injected fault kinds (benchmarks/chaos_faults.py) can cause each miss reason
CAUSES = {
    # the instance reached the slot late: paused, or a tick blocked on a slow store or broker call
    "late_local": ("pause", "latency", "store-restart", "store-lock", "broker-outage"),
    # the claim reached the store late on its clock, or early: skew, or a claim held up
    "late": ("pause", "skew", "latency", "store-restart", "store-lock", "broker-outage"),
    "early": ("skew",),
    # the store lost its data (a Redis without persistence restarted)
    "forgotten": ("store-restart",),
    "store_unreachable": ("store-restart", "store-lock", "latency"),
    "unknown": ("store-restart", "store-lock", "latency"),
    "unconfirmed": ("store-restart", "latency"),
    # a send failing until max_late (broker down), or a claim answered after max_late
    "send_failed": ("broker-outage", "latency", "store-restart", "store-lock", "pause"),
    # a publish that broke off: the broker went down, or beat was stopped mid-publish
    "send_unknown": ("broker-outage", "skew", "kill"),
    # the winner died between its claim and its send (killed, or restarted with another clock)
    "claimed": ("kill", "skew"),
    # leased runs held up past their next slot or their attempts
    "overlapping": ("pause-runner", "broker-outage", "kill", "pause", "latency", "store-restart",
                    "store-lock"),
    "superseded": ("pause-runner", "broker-outage", "kill", "pause", "latency", "store-restart",
                   "store-lock"),
    "lost": ("pause-runner", "broker-outage", "kill", "pause", "store-restart", "store-lock"),
    # an expired run the store refused to take over after it lost writes (a restart, a failover)
    "not_taken_over": ("store-restart",),
}
#: the Sentinel rig's faults (--store redis-sentinel): a promotion changes the epoch (the new
#: master's run_id), so the slots around it are refused ``forgotten``; a lagging replica, and the
#: replicas' resync after a promotion, make a WAIT fall short (``unconfirmed``); until Sentinel
#: promotes a replica the store cannot be reached, and claims and sends are held up
FAILOVERS = ("master-kill", "failover", "lag-failover", "pause-failover")
for _reason in ("forgotten", "unconfirmed", "store_unreachable", "unknown", "late_local", "late",
                "send_failed", "overlapping", "superseded", "lost", "not_taken_over"):
    CAUSES[_reason] += FAILOVERS

#: faults of one beat: they explain a reason only that beat recorded (leased runs' reasons aside)
ONE_BEAT = ("kill", "pause", "skew")
#: the reasons of leased runs: a run held up by a fault lives on (its queue timeout, its lease,
#: takeovers, up to 3 attempts) and makes later slots overlap or supersede it
LEASE_REASONS = ("overlapping", "superseded", "lost", "not_taken_over")

#: a fault touches runs whose claims or sends are still retried when it begins: until max_late
#: (15 s) after the slot, 20 s on the true clock for the beat whose clock runs 5 s behind
BEFORE_S = 20.0
#: ... whose slot comes before it ends, plus the settling: the jitter (up to 2 s), the tick the
#: fault held up (a store call waits up to its claim_timeout), a chunk the store latency held
#: back (up to 2 s)
AFTER_S = 5.0
#: a store restart makes the store forget (a new epoch, or no persistence): slots whose claims were
#: still retried when it went down (max_late 15 s + the 10 s tolerance) up to those the restarted
#: store refuses (10 s after the first claim reaches it, which the beats' outage backoff delays by
#: a few seconds: measured up to 12.6 s after the restart, in the 60 s run of tests/system/test_chaos.py)
FORGOTTEN_BEFORE_S, FORGOTTEN_AFTER_S = 25.0, 15.0
#: a leased run lives up to about 45 s after its slot (10 s queued, 6 s leases, 1 s heartbeats, up
#: to 3 attempts), so a fault that begins that long after the slot can still hold it up. A run
#: superseded, lost or not taken over was alive during the fault (its slot came before the end,
#: plus a run queued behind the stale ones when the worker resumed); a new slot overlaps a run
#: the fault held up for as long as that run lives on after it: up to about 45 s
LEASE_BEFORE_S = 45.0
LEASE_AFTER_S = {"overlapping": 45.0, "superseded": 15.0, "lost": 15.0, "not_taken_over": 15.0}
#: a Sentinel failover's record ends when the harness is done with it, not when the store has
#: settled: SENTINEL FAILOVER demotes the old master about 11 s later, the clients follow, and
#: the new epoch refuses 10 s more
FAILOVER_AFTER_S = 30.0


def window(reason: str, kind: str) -> tuple[float, float]:
    """(before, after) in seconds: a fault of ``kind`` can cause ``reason`` for a run whose slot
    lies from ``before`` before the fault's start to ``after`` after its end."""
    if reason in LEASE_REASONS:
        before, after = LEASE_BEFORE_S, LEASE_AFTER_S[reason]
    elif reason == "forgotten":
        before, after = FORGOTTEN_BEFORE_S, FORGOTTEN_AFTER_S
    else:
        before, after = BEFORE_S, AFTER_S
    if kind in FAILOVERS:
        after = max(after, FAILOVER_AFTER_S)
    return before, after


class Span(collections.namedtuple("Span", "start end beats")):
    """One injected fault: ``start`` and ``end`` (epoch seconds) and, for a fault of one beat,
    the ``beats`` it hit (names, e.g. ``("beat-5",)``); empty for the store, the broker, the
    leased worker."""


def fault_windows(faults: list[dict], skewed_beats: set[str] = frozenset()
                  ) -> dict[str, list[Span]]:
    """kind -> the :class:`Span` of every injected (not skipped) fault of that kind.

    :param skewed_beats: the beats restarted under the skewed clock (the skew fault's target)."""
    spans: dict[str, list[Span]] = collections.defaultdict(list)
    for f in faults:
        if f.get("skipped") or not f.get("started"):
            continue
        beats = ((f.get("target") or "",) if f["kind"] in ("kill", "pause")
                 else tuple(sorted(skewed_beats)) if f["kind"] == "skew" else ())
        spans[f["kind"]].append(Span(f["started"], f.get("ended") or f["started"], beats))
    return spans


def caused_by(reason: str, slot_ms: int, spans: dict[str, list[Span]],
              sources: set[str | None] | None = None) -> list[str]:
    """The injected faults (``kind@start``) that can cause ``reason`` for a run at ``slot_ms``: of
    a kind in :data:`CAUSES`, with the slot inside the fault's :func:`window`, and (a fault of
    one beat, not a leased run's reason) a beat among ``sources``.

    :param sources: the beats that recorded ``reason`` for this run (``None`` in it: a record
        whose instance is not a beat's, or a worker's line); ``None``: not checked.
    """
    slot = slot_ms / 1000
    found = []
    for kind in CAUSES.get(reason, ()):
        before, after = window(reason, kind)
        tied = kind in ONE_BEAT and reason not in LEASE_REASONS and sources is not None
        for span in spans.get(kind, ()):
            if not span.start - before <= slot <= span.end + after:
                continue
            if tied and not set(span.beats) & set(sources):
                continue
            found.append(f"{kind}@{span.start:.1f}")
    return found


def coverage(reason: str, spans: dict[str, list[Span]], t0: float, t1: float) -> float:
    """The share of the window (t0, t1], epoch seconds, whose slots some injected fault can
    explain ``reason`` for, whatever beat recorded it: how much the verdict lets pass."""
    pieces = sorted((max(t0, s.start - before), min(t1, s.end + after))
                    for kind in CAUSES.get(reason, ()) for before, after in [window(reason, kind)]
                    for s in spans.get(kind, ()))
    covered, reach = 0.0, t0
    for lo, hi in pieces:
        lo = max(lo, reach)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered / (t1 - t0) if t1 > t0 else 0.0
