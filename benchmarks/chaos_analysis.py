"""What happened to every run of the chaos run's measured window (benchmarks/chaos.py).

Inputs, all in the run's --out folder: ``executions.jsonl`` (one line per task event, written by
the task bodies of tests/support/apps/chaos_app.py), ``history.jsonl`` (every distinct record seen in the
store's history, dumped every few seconds and before each store restart, since a Redis without
persistence forgets its history too), ``instances.jsonl`` (each beat process: its log and how it
ended) and the logs of every beat and worker.

Each expected run (every slot of every entry in the window) is then one of:

* **executed exactly once**: one task body ran (leased entries: one ``start``);
* **duplicate**: two or more bodies ran. For a leased entry two bodies are allowed only when the
  guarantee allows it ("unless a runner was paused past its lease; it then learns that it lost
  the lease"): every body but the last learned that it lost its lease, either inside the body
  (the task saw ``current_lease().lost`` and stopped) or, when the harness had paused its worker
  (SIGSTOP) while it ran, at its release (the worker logged that the release found the lease taken
  over). Those are counted apart (``lease_lost_reruns``), never as duplicates. A body that ran to
  its end unpaused and whose release found the lease taken over (its lease ran out while the
  store could not be reached) is a duplicate: the guarantee does not allow that one;
* **explained miss**: no body ran, the store's history or a log line names one of the reasons
  of docs/design.md "The guarantee" for that run, **and an injected fault that can cause that reason
  was on around the run's slot, on the beat that named it when the fault hit one beat**
  (benchmarks/chaos_causes.py: :data:`CAUSES`, the window of each reason from before the fault's
  start to after its end, the beat of a kill, a pause or the clock skew). A reason with no such
  fault does not explain the miss: the run counts as unexplained (``reasons_without_fault``). A
  history record ``claimed`` (a claim without a send) explains a miss only when its instance was
  killed or restarted by the harness (the winner died between its claim and its send);
* **sent, then lost by the broker**: no body ran, the history says the winner sent it, and the
  broker's own AOF shows a worker popped the message and the broker stopped before kombu recorded
  it as unacked (see :func:`broker_fates`). The scheduler did its part (the guarantee ends at the
  send); counted apart and printed, never hidden among the explained misses;
* **sent, delivered to a worker and never acknowledged**: the broker's AOF shows a worker took
  the message and recorded it unacked, and no body ran: the worker lost it (its connection to the
  broker dropped before it handled the message, or it died); kombu gives it back only after its
  visibility timeout (an hour by default), after the run. Counted apart and printed, as above;
* **unexplained miss**: anything else (for example a run the history says was sent, but that
  never ran, without that proof from the broker).

The two broker-side kinds are bounded too (:func:`broker_loss_verdict`): each must fall in the
window of a broker outage or of a worker that died, and there may be at most
``MAX_POPPED_LOST_PER_OUTAGE`` popped-and-lost and ``MAX_UNACKED_PER_OUTAGE`` never-acknowledged
messages per broker outage or worker death; beyond that the scheduler is suspect, not the broker.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
from datetime import datetime

from chaos_causes import CAUSES, LEASE_REASONS, caused_by, fault_windows  # noqa: F401

#: history events that explain a run that did not run (RunEvent values)
MISS_EVENTS = ("late", "late_local", "early", "forgotten", "overlapping", "superseded",
               "store_unreachable", "send_failed", "send_unknown", "unknown", "unconfirmed",
               "claimed", "lost", "given_up", "not_taken_over")

#: a leased run recorded lost because the store may have lost writes to its record (an epoch
#: change or amnesia since its claim: its release or adoption may be gone), not after max_attempts:
#: the stores' history detail (redis_scripts.TAKE_OVER, sql_leases) and the engine's log line
NOT_TAKEN_OVER = "not taken over"

#: a broker-side loss (below) falls near a broker outage or a worker's death: a message sent up to
#: max_late (15 s) plus 5 s before it, and the worker's reconnect back-off after it
BROKER_WINDOW_BEFORE_S, BROKER_WINDOW_AFTER_S = 20.0, 30.0
#: broker-side losses allowed per broker outage or worker death: one BRPOP in flight per worker
#: connection (two workers) can be lost with the broker; a worker whose connection dropped can
#: hold a few prefetched messages it never acknowledges
MAX_POPPED_LOST_PER_OUTAGE = 2
MAX_UNACKED_PER_OUTAGE = 10

#: when only log lines name a reason: the store-side and broker-side ones first, since a paused
#: instance's own late skip says less about the run than the outage the others met
LOG_PRIORITY = ("claimed", "send_failed", "send_unknown", "forgotten", "not_taken_over",
                "unconfirmed", "store_unreachable", "superseded", "overlapping", "lost", "late", "early", "unknown",
                "late_local")

_ISO = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00)"
_ENTRY = r"(?P<entry>[\w.-]+)"
#: beat log lines (celery_anarchon/engine/) -> reason
BEAT_PATTERNS = [
    (re.compile(_ENTRY + r": slot " + _ISO + r" skipped as late"), "late_local"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" not claimed: the store .* could not be reached"),
     "store_unreachable"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" not sent: the send kept failing"), "send_failed"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" recorded lost after"), "lost"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" attempt \d+ recorded lost, not taken over"),
     "not_taken_over"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" attempt \d+: the publish broke off"), "send_unknown"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" won but not sent: beat is shutting down"), "claimed"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" won but not sent: the claim answered after"),
     "send_failed"),
    (re.compile(_ENTRY + r": slot " + _ISO + r" superseded by a newer slot instead of a takeover"),
     "superseded"),
]
BEAT_RANGE = re.compile(_ENTRY + r": \d+ slots from " + _ISO + " to " + _ISO + " skipped as late")
BEAT_SKIP = re.compile(_ENTRY + r": slot " + _ISO + r" skipped: (?P<why>.*)")
SKIP_REASONS = [("late on the store's clock", "late"), ("early on the store's clock", "early"),
                ("the store does not remember", "forgotten"), ("an earlier run", "overlapping"),
                ("a newer slot", "superseded"), ("the store could not tell", "unknown"),
                ("won, but the store did not confirm", "unconfirmed")]
#: worker log lines (celery_anarchon/leases.py); slots are integer ms there
WORKER_DROP = re.compile(_ENTRY + r": dropped a message of slot (?P<slot>\d+) \(attempt (?P<attempt>\d+)"
                         r", task \S+\) without running it: the run is (?P<state>[a-z ]+?)[ .(]")
WORKER_NO_ADOPT = re.compile(_ENTRY + r": slot (?P<slot>\d+) attempt (?P<attempt>\d+) not run: the "
                             r"store could not be reached")
WORKER_LOST = re.compile(_ENTRY + r": slot (?P<slot>\d+) attempt (?P<attempt>\d+) lost its lease")
WORKER_REFUSED = re.compile(_ENTRY + r": slot (?P<slot>\d+) attempt (?P<attempt>\d+) finished, but its "
                            r"lease had been taken over")
INSTANCE = re.compile(r"anarchon: instance (\S+),")
SENDING = re.compile(r"Sending due task " + _ENTRY + r" \(\S+\) slot " + _ISO + r" attempt (\d+)")


def miss_event(rec: dict) -> str:
    """The miss reason a history record names: its event, except ``not_taken_over`` for a run
    recorded lost because the store may have lost writes to it (:data:`NOT_TAKEN_OVER`)."""
    event = "lost" if rec["event"] == "given_up" else rec["event"]   # given up after max_attempts
    if event == "lost" and NOT_TAKEN_OVER in (rec.get("detail") or ""):
        return "not_taken_over"
    return event


def iso_ms(text: str) -> int:
    return int(round(datetime.fromisoformat(text).timestamp() * 1000))


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_runs(periods_ms: dict[str, int], t0_ms: int, t1_ms: int) -> set[tuple[str, int]]:
    """Every slot of every entry in (t0, t1]: slots are the multiples of the period since the epoch."""
    runs = set()
    for entry, period in periods_ms.items():
        slot = t0_ms - t0_ms % period + period
        while slot <= t1_ms:
            runs.add((entry, slot))
            slot += period
    return runs


def log_reasons(out: str, instances: list[dict], periods_ms: dict[str, int]):
    """(entry, slot) -> reasons named by log lines; ((entry, slot), reason) -> the beats whose
    log named it (``None``: a worker's log); the bodies whose release found their lease taken
    over, and the bodies whose heartbeat logged that it lost the lease, as (entry, slot,
    attempt)."""
    reasons: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    sources: dict[tuple[tuple[str, int], str], set[str | None]] = collections.defaultdict(set)
    refused: set[tuple[str, int, int]] = set()
    lost_warned: set[tuple[str, int, int]] = set()
    beat_logs = [(i["log"], i.get("beat")) for i in instances]
    worker_logs = [(os.path.join(out, n), None) for n in os.listdir(out)
                   if n.startswith("worker-") and n.endswith(".log")]
    for path, beat in beat_logs + worker_logs:
        if not os.path.exists(path):
            continue

        def note(run: tuple[str, int], reason: str, beat: str | None = beat) -> None:
            reasons[run].add(reason)
            sources[(run, reason)].add(beat)
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "slot" not in line:
                    continue
                for pattern, reason in BEAT_PATTERNS:
                    m = pattern.search(line)
                    if m:
                        note((m.group("entry"), iso_ms(m.group(2))), reason)
                if m := BEAT_RANGE.search(line):
                    entry, lo, hi = m.group("entry"), iso_ms(m.group(2)), iso_ms(m.group(3))
                    period = periods_ms.get(entry)
                    if period:
                        for slot in range(lo, hi + 1, period):
                            note((entry, slot), "late_local")
                if m := BEAT_SKIP.search(line):
                    why = next((r for text, r in SKIP_REASONS if m.group("why").startswith(text)),
                               "skipped: " + m.group("why")[:40])
                    note((m.group("entry"), iso_ms(m.group(2))), why)
                if m := WORKER_DROP.search(line):
                    state = m.group("state").strip()
                    run = (m.group("entry"), int(m.group("slot")))
                    # the lazy pattern stops at the first space: "unknown" (to the store)
                    if state in ("unknown", "unknown to the store"):
                        note(run, "forgotten")               # the store lost the run's record
                    elif state in ("superseded", "lost"):
                        note(run, state)
                if m := WORKER_NO_ADOPT.search(line):
                    note((m.group("entry"), int(m.group("slot"))), "store_unreachable")
                if m := WORKER_LOST.search(line):
                    lost_warned.add((m.group("entry"), int(m.group("slot")), int(m.group("attempt"))))
                if m := WORKER_REFUSED.search(line):
                    refused.add((m.group("entry"), int(m.group("slot")), int(m.group("attempt"))))
    return reasons, sources, refused, lost_warned


#: how :func:`broker_fates` names a message the broker handed to a worker and then lost
BROKER_LOST = "popped by a worker and never recorded as unacked"
#: ... and one a worker took and never acknowledged (kombu restores it after its visibility
#: timeout, an hour by default: after the run)
BROKER_UNACKED = "delivered to a worker and never acknowledged"
#: a worker's log line when it dies (Celery's "Unrecoverable error")
WORKER_CRASH = "Unrecoverable error"


def broker_fates(out: str, task_ids: set[str]) -> dict[str, str]:
    """Diagnostics for runs sent but never executed: what the broker's AOF (a Redis 7 multi-part
    AOF in ``broker-data``) says happened to each message of ``task_ids``. Kombu's Redis transport
    pops a message (BRPOP, written to the AOF as RPOP) and then records it as unacked in a second
    command; a broker stopped between the two loses the message."""
    fates = {t: "never pushed to the broker" for t in task_ids}
    if not task_ids:
        return fates
    commands = []
    for path in sorted(glob.glob(os.path.join(out, "broker-data", "appendonlydir", "*.incr.aof"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data) and data[pos:pos + 1] == b"*":
            end = data.index(b"\r\n", pos)
            count, pos, args = int(data[pos + 1:end]), end + 2, []
            for _ in range(count):
                end = data.index(b"\r\n", pos)
                size, pos = int(data[pos + 1:end]), end + 2
                args.append(data[pos:pos + size])
                pos += size + 2
            commands.append(args)
    queues: dict[bytes, collections.deque] = collections.defaultdict(collections.deque)
    popped: set[str] = set()
    tags: dict[bytes, str] = {}
    wanted = {t.encode(): t for t in task_ids}

    def ours(value: bytes) -> str | None:
        return next((t for raw, t in wanted.items() if raw in value), None)
    for args in commands:
        op = args[0].upper()
        if op == b"LPUSH":
            for value in args[2:]:
                queues[args[1]].appendleft(value)
                if (t := ours(value)) and fates[t] == "never pushed to the broker":
                    fates[t] = "pushed, still queued when the run ended"
        elif op == b"RPOP" and queues[args[1]]:
            if t := ours(queues[args[1]].pop()):
                popped.add(t)
                fates[t] = (BROKER_LOST + ": lost when the broker stopped between kombu's BRPOP "
                            "and its unacked bookkeeping")
        elif op == b"HSET" and args[1] == b"unacked":
            for tag, value in zip(args[2::2], args[3::2]):
                if (t := ours(value)) in popped:
                    fates[t] = BROKER_UNACKED
                    tags[tag] = t
        elif op == b"HDEL" and args[1] == b"unacked":
            for tag in args[2:]:
                if (t := tags.get(tag)) is not None:
                    fates[t] = "delivered to a worker and acknowledged"
    return fates


def worker_crashes(out: str) -> list[str]:
    """The "Unrecoverable error" lines of the workers' logs: a worker that died by itself."""
    found = []
    for path in sorted(glob.glob(os.path.join(out, "worker-*.log"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            found += [f"{os.path.basename(path)}: {line.strip()[:200]}" for line in f
                      if WORKER_CRASH in line]
    return found


def broker_loss_verdict(runs: list[tuple[str, int]], per_outage: int, windows: dict[str, list],
                        worker_restarts: list[dict]) -> dict:
    """Whether broker-side losses (``runs``: (entry, slot)) are what broker outages and worker
    deaths can cause: each slot within ``BROKER_WINDOW_BEFORE_S`` before to
    ``BROKER_WINDOW_AFTER_S`` after one, and at most ``per_outage`` of them per outage or death.

    :param windows: :func:`chaos_causes.fault_windows`."""
    spans = ([(w.start, w.end) for w in windows.get("broker-outage", ())]
             + [(r["at"], r["at"]) for r in worker_restarts])
    outside = [run for run in runs
               if not any(a - BROKER_WINDOW_BEFORE_S <= run[1] / 1000 <= b + BROKER_WINDOW_AFTER_S
                          for a, b in spans)]
    bound = per_outage * len(spans)
    return {"count": len(runs), "bound": bound, "outside_windows": outside[:20],
            "ok": not outside and len(runs) <= bound}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def analyse(out: str, periods_ms: dict[str, int], leased: set[str], t0_ms: int, t1_ms: int,
            worker_restarts: list[dict] | None = None) -> dict:
    """The figures of one run (see the module docstring); also writes ``runs.jsonl`` with the
    verdict on every expected run that did not run exactly once."""
    want = expected_runs(periods_ms, t0_ms, t1_ms)
    events = read_jsonl(os.path.join(out, "executions.jsonl"))
    instances = read_jsonl(os.path.join(out, "instances.jsonl"))
    for inst in instances:
        with open(inst["log"], encoding="utf-8", errors="replace") as f:
            m = INSTANCE.search(f.read())
        inst["instance"] = m.group(1) if m else None
    killed = {i["instance"] for i in instances if i.get("ended_by") == "SIGKILL" and i["instance"]}
    skewed = {i["instance"] for i in instances if i.get("skew") and i["instance"]}
    # a beat restarted by the harness (a kill, or a restart with another clock) may have died
    # between a claim and its send
    ended = {i["instance"] for i in instances if i.get("ended_by") in ("SIGKILL", "SIGTERM")
             and i["instance"]}
    history: dict[tuple[str, int], list[dict]] = collections.defaultdict(list)
    for rec in read_jsonl(os.path.join(out, "history.jsonl")):
        history[(rec["entry"], rec["slot_ms"])].append(rec)
    reasons, log_sources, refused, lost_warned = log_reasons(out, instances, periods_ms)
    beat_of = {i["instance"]: i.get("beat") for i in instances if i["instance"]}
    takeovers = dropped = 0
    sends: collections.Counter = collections.Counter()    # (entry, slot) -> publishes tried
    for path in [i["log"] for i in instances] + [os.path.join(out, n) for n in os.listdir(out)
                                                 if n.startswith("worker-") and n.endswith(".log")]:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        takeovers += text.count(" taken over as attempt ")
        dropped += text.count(": dropped a message of slot ")
        for m in SENDING.finditer(text):
            sends[(m.group("entry"), iso_ms(m.group(2)))] += 1

    bodies: dict[tuple[str, int], list[dict]] = collections.defaultdict(list)
    lost_in_body: set[str] = set()
    ended_normally: set[tuple[str, int, int]] = set()
    body_end: dict[str, float] = {}
    for e in events:
        if e["kind"] in ("end", "lost"):
            body_end[e["task_id"]] = e["time"]
    faults = read_jsonl(os.path.join(out, "faults.jsonl"))
    # the skew's target: the beat restarted under the skewed clock
    windows = fault_windows(faults, {i["beat"] for i in instances
                                     if i.get("skew") and i.get("beat")})
    runner_paused = windows.get("pause-runner", [])

    # a runner holds its lease from the adoption (history "started", just before the body), so
    # a pause between the adoption and the body's first line is a pause of the runner too
    adopted_at = {rec["task_id"]: rec["store_ms"] / 1000 for recs in history.values() for rec in recs
                  if rec["event"] == "started" and rec.get("task_id")}

    def paused_while_running(body: dict) -> bool:
        end = body_end.get(body["task_id"], float("inf"))
        start = min(body["time"], adopted_at.get(body["task_id"], body["time"]))
        return any(p.start <= end and p.end >= start for p in runner_paused)

    for e in events:
        if e["kind"] in ("run", "start"):
            bodies[(e["entry"], e["slot"])].append(e)
        elif e["kind"] == "lost":
            lost_in_body.add(e["task_id"])
        elif e["kind"] == "end":
            ended_normally.add((e["entry"], e["slot"], e["attempt"]))
    # a body learned it lost its lease when it saw current_lease().lost (it noted "lost"), or
    # when its release found the lease taken over; a heartbeat's "lost its lease" warning about a
    # body that ended normally and was released is not that (see the report)
    learned = refused | {(e["entry"], e["slot"], e["attempt"]) for e in events
                         if e["kind"] == "lost"}
    spurious = lost_warned & ended_normally - refused

    once, duplicates, reruns, explained, unexplained = 0, [], [], [], []
    without_fault: collections.Counter = collections.Counter()   # reason -> misses it alone named
    lateness, lateness_plain, lateness_unskewed, sent_by_skewed = [], [], [], 0
    by_reason: collections.Counter = collections.Counter()
    verdicts = []
    for run in sorted(want):
        entry, slot = run
        ran = sorted(bodies.get(run, []), key=lambda e: e["time"])
        if ran:
            late = ran[0]["time"] - slot / 1000
            lateness.append(late)
            if entry not in leased:
                lateness_plain.append(late)
            if ran[0].get("instance") in skewed:
                sent_by_skewed += 1
            else:
                lateness_unskewed.append(late)
        if len(ran) == 1:
            once += 1
            continue
        if len(ran) > 1:
            knew = [b for b in ran[:-1] if b["task_id"] in lost_in_body
                    or ((entry, slot, b.get("attempt") or 0) in refused and paused_while_running(b))]
            kind = "lease_lost_rerun" if entry in leased and len(knew) >= len(ran) - 1 else "duplicate"
            # diagnostics: one message delivered twice has one task id; "sends" counts the
            # beat log's "Sending due task" lines (each try of a publish, retries included)
            item = {"entry": entry, "slot": slot, "verdict": kind, "bodies": ran,
                    "task_ids": sorted({b["task_id"] for b in ran}), "sends": sends[run],
                    "history": history.get(run, [])}
            (reruns if kind == "lease_lost_rerun" else duplicates).append(item)
            verdicts.append(item)
            continue
        # not run: look for a recorded reason. The run's reason is the store's (its newest
        # history record that names one), else the first log reason in LOG_PRIORITY
        recorded = [miss_event(rec) for rec in sorted(history.get(run, []),
                                                      key=lambda r: r["store_ms"])
                    if rec["event"] in MISS_EVENTS
                    and (rec["event"] != "claimed" or rec["instance"] in ended)]
        found = set(reasons.get(run, ())) | set(recorded)
        # who named each reason: the beats of the history records' instances, the beats whose
        # log named it (None: a worker, or an instance that is no beat of the run)
        sources = {r: set(log_sources.get((run, r), ())) for r in found}
        for rec in history.get(run, []):
            if rec["event"] in MISS_EVENTS and miss_event(rec) in sources:
                sources[miss_event(rec)].add(beat_of.get(rec.get("instance")))
        item = {"entry": entry, "slot": slot, "history": history.get(run, []),
                "log_reasons": sorted(reasons.get(run, ()))}
        # a reason explains the miss only with an injected fault that can cause it, around the
        # slot, and (a fault of one beat) on the beat that named the reason
        causes = {r: caused_by(r, slot, windows, sources[r]) for r in found}
        accepted = {r for r, c in causes.items() if c}
        recorded_ok = [r for r in recorded if r in accepted]
        if accepted:
            reason = recorded_ok[-1] if recorded_ok else next(
                (r for r in LOG_PRIORITY if r in accepted), sorted(accepted)[0])
            by_reason[reason] += 1
            item.update(verdict="explained", reason=reason, reasons=sorted(found),
                        faults=causes[reason])
            explained.append(item)
        else:
            item["verdict"] = "unexplained"
            if found:
                item["reasons_without_fault"] = sorted(found)
                without_fault.update(found)
            unexplained.append(item)
        verdicts.append(item)

    sent = {rec["task_id"]: item for item in unexplained for rec in item["history"]
            if rec["event"] == "sent" and rec["task_id"]}
    for task_id, fate in broker_fates(out, set(sent)).items():
        sent[task_id]["broker"] = fate
    lost_by_broker = [u for u in unexplained if u.get("broker", "").startswith(BROKER_LOST)]
    for item in lost_by_broker:
        item["verdict"] = "sent_lost_by_broker"
    crashed = worker_crashes(out)
    lost_with_worker = [u for u in unexplained if u.get("broker", "").startswith(BROKER_UNACKED)]
    for item in lost_with_worker:
        item["verdict"] = "sent_unacked_by_worker"
    unexplained = [u for u in unexplained if u not in lost_by_broker and u not in lost_with_worker]
    restarts = worker_restarts or []
    popped_lost = broker_loss_verdict([(u["entry"], u["slot"]) for u in lost_by_broker],
                                      MAX_POPPED_LOST_PER_OUTAGE, windows, restarts)
    never_acked = broker_loss_verdict([(u["entry"], u["slot"]) for u in lost_with_worker],
                                      MAX_UNACKED_PER_OUTAGE, windows, restarts)

    with open(os.path.join(out, "runs.jsonl"), "w", encoding="utf-8") as f:
        for item in verdicts:
            f.write(json.dumps(item) + "\n")

    def dist(values):
        return {"n": len(values), **{name: percentile(values, q) for name, q in
                (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))},
                "min": min(values) if values else None}

    return {
        "expected": len(want), "executed_once": once, "duplicates": len(duplicates),
        "lease_lost_reruns": len(reruns),
        "missed": len(explained) + len(unexplained) + len(lost_by_broker) + len(lost_with_worker),
        "worker_crashes": crashed,
        "sent_unacked_by_worker": len(lost_with_worker),
        "sent_unacked_by_worker_runs": [(u["entry"], u["slot"]) for u in lost_with_worker][:50],
        "sent_lost_by_broker": len(lost_by_broker),
        "sent_lost_by_broker_runs": [(u["entry"], u["slot"]) for u in lost_by_broker][:50],
        "explained": len(explained), "unexplained": len(unexplained),
        "reasons_without_fault": dict(without_fault.most_common()),
        "sent_lost_by_broker_verdict": popped_lost, "sent_unacked_by_worker_verdict": never_acked,
        "broker_losses_ok": popped_lost["ok"] and never_acked["ok"],
        "explained_by_reason": dict(by_reason.most_common()),
        "lateness_s": dist(lateness), "lateness_plain_s": dist(lateness_plain),
        "lateness_unskewed_s": dist(lateness_unskewed), "sent_by_skewed": sent_by_skewed,
        "takeovers": takeovers, "dropped_messages": dropped, "leases_lost": len(learned),
        "spurious_lost_warnings": len(spurious), "spurious_lost_runs": sorted(spurious)[:20],
        "duplicate_runs": [(d["entry"], d["slot"]) for d in duplicates][:50],
        "unexplained_runs": [(u["entry"], u["slot"]) + ((u["broker"],) if "broker" in u else ())
                             for u in unexplained][:50],
        "instances": len(instances), "killed_instances": len(killed),
    }
