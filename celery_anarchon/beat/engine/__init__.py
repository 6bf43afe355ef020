"""The life of a run on one instance (docs/design.md "One run, in time"), free of Celery.

The engine keeps a heap with one pending run per entry, fired at slot + jitter (jitter drawn per
run, per instance, from the operating system's random source, so forked processes never share a
sequence). Each tick claims every run that came due in one batch, sends the won ones through a
callback, and returns how long to sleep (never more than 60 s). It never sends a run without a won
claim: a store that cannot be reached means no sends (logged and retried until max_late).

Two injected clocks, so tests drive them: ``clock`` (the wall clock, seconds since the epoch)
decides what is due and what is late (slots are instants); ``monotonic`` (seconds, any origin)
times every "how long since / wait until": the store outage backoff, send retries, claim retry
waits, lease checks and their grace, takeover retries, log rate limits. A wall clock stepped back
or forward therefore never freezes a retry or a takeover, nor fires one early.

The parts, each in its module, each given what it needs by the coordinator (:class:`Engine`,
``coordinator``):

* ``due``: the heap of due runs, seeding at start-up, slots reached too late;
* ``claims``: claim requests and the claims that wait for the store until max_late;
* ``pace``: the size of a claim chunk in a burst (what this instance claims and sends in 30 ms);
* ``chunks``: the claims of the due runs in chunks of that size, and what each answer means
  (counted, logged, the slot handled, a won run sent, a refusal skipped);
* ``sends``: the send queue (sends, their retries, a publish that broke off, won after max_late);
* ``notes``: the history notes, buffered and written once per tick;
* ``outage``: the store outage backoff and its log;
* ``takeovers``: lease checks, takeovers and the takeovers asked again;
* ``skew``: this instance's clock measured against the store's;
* ``skips``: skipped slots in the log, rate-limited;
* ``gaps``: the slots no instance claimed in time, found in the store's history once this
  instance settled (at start-up, after a store outage) and recorded ``missed`` once;
* ``definitions``: entry definitions saved, and a different definition named in the log;
* ``counters``: the counters and their periodic log;
* ``observe``: the observer hook, told each claim outcome, send, lease event, store round trip
  and more (no-ops; :mod:`celery_anarchon.beat.metrics` implements it for Prometheus);
* ``follow``: when the store is followed (the sync and the heartbeat below);
* ``sync`` (an entry store only): the store's entries, pauses and run-now requests, followed
  every ``anarchon_sync_interval``;
* ``instances`` (an entry store only): this instance's heartbeat, and the live instances that
  run another definition of a config entry.
"""
from celery_anarchon.beat.engine.coordinator import MAX_SLEEP_S, Engine
from celery_anarchon.beat.engine.sends import SendFn

__all__ = ["Engine", "MAX_SLEEP_S", "SendFn"]
