"""The worker side of leases (docs/design.md "Leases").

``celery_anarchon.install(app)`` goes in the app module, right after the app is configured, so
every process that loads the app has it: beat (which refuses leased entries without it), the
worker's main process, its prefork children (forked, or spawned: they import the app module
again), the threads and solo pools::

    app = Celery("proj")
    app.config_from_object("proj.settings")
    celery_anarchon.install(app)

It wraps the call path of every task of the app (``__call__`` and ``retry``; Celery swallows
exceptions raised in signal handlers, so a signal could not stop a body). A message without our
lease headers runs untouched. For a leased message, before the body runs:

* one atomic compare-and-set **adopts** the run: it succeeds when the run is queued (whichever
  attempt's message this is) or started with an expired lease, and issues a new fencing token;
* any other message of the run (a duplicate delivery while it runs, a message of a run that
  finished, was superseded or lost) is **dropped** without running the body: logged and counted;
  so is the message of a run not started yet whose entry is paused (the store ends the run
  paused, atomically with the pause); a pause never stops a body that runs;
* a **heartbeat** thread in the executing process renews the lease every ``heartbeat`` seconds by
  token; a renewal that finds its token stale marks the lease lost (:func:`current_lease`);
* when the task returns or fails for good the lease is **released** by token; a retry hands the
  run back to the queue by token first (queue deadline = the retry's ETA + queue_timeout), so the
  retried message adopts it again. Nothing is released from the pool parent (a SIGKILLed child's
  ``WorkerLostError``): its lease simply expires and beat takes the run over.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timezone

from celery import signals
from celery.app.trace import task_has_custom
from celery.exceptions import Ignore, Reject, Retry

from celery_anarchon.worker import metrics as worker_metrics
from celery_anarchon.errors import ConfigError, LeaseLost, StoreError
from celery_anarchon.messages import (
    HEADER_ATTEMPT, HEADER_ENTRY, HEADER_LEASE, HEADER_NAMESPACE, HEADER_SLOT, HEADER_TOKEN,
    INSTALLED_ATTR, is_installed,
)
from celery_anarchon.stores.base import RunState, lease_store

logger = logging.getLogger("celery_anarchon.worker.leases")

#: a release that cannot reach the store is retried this often (seconds) ...
RELEASE_RETRY_S = 0.2
#: ... for this long (seconds), or two lease durations if longer: the task's result waits meanwhile
RELEASE_PATIENCE_S = 300.0

#: what the worker side did, per process (adopted, dropped, lost, released, ...)
counters: collections.Counter = collections.Counter()


def _count(app, event: str) -> None:
    """Count ``event`` in :data:`counters` and in the worker's lease metrics."""
    counters[event] += 1
    worker_metrics.count(app, event)


_PATCHED_ATTR = "_anarchon_patched"
_local = threading.local()
_stores: dict = {}
_stores_lock = threading.Lock()
#: (pid, store URL) pairs whose store this process has named in its log
_named: set = set()


@dataclasses.dataclass
class Lease:
    """The lease held by the running task on its run (see :func:`current_lease`).

    :param token: the fencing token of this attempt's lease: hand it to the systems the task
        writes to, so they can refuse a writer whose token is older than one they have seen.
    :param expires_ms: when the lease ends on the store's clock, UTC ms (renewed every heartbeat).
    """

    entry: str
    slot_ms: int
    attempt: int
    token: int
    owner: str
    duration_s: float
    heartbeat_s: float
    expires_ms: int
    lost: bool = False

    @property
    def expires_at(self) -> datetime:
        """When the lease ends if it is not renewed (aware UTC, the store's clock)."""
        return datetime.fromtimestamp(self.expires_ms / 1000, tz=timezone.utc)

    def check(self) -> None:
        """Raise :class:`~celery_anarchon.LeaseLost` if the run was taken over: another attempt
        owns it now, and this one should stop (its writes would be fenced off)."""
        if self.lost:
            raise LeaseLost(f"{self.entry}: the lease of slot {self.slot_ms} (attempt {self.attempt}, "
                            f"token {self.token}) was taken over by another attempt")


def current_lease() -> Lease | None:
    """The lease of the leased run this thread is executing, or ``None`` outside one.

    Inside a leased task: ``.lost`` (a renewal found the token stale), ``.token`` (the fencing
    token), ``.expires_at``, and ``.check()``, which raises :class:`~celery_anarchon.LeaseLost`.
    """
    return getattr(_local, "lease", None)


# -- installation ---------------------------------------------------------------------------------

def install(app) -> None:
    """Install the worker side of leases on ``app`` (idempotent).

    Call it in the app module after configuring the app. It wraps every task of the app, those
    declared later included (they are wrapped when the app is finalized and when the worker
    starts, before any task runs).
    """
    setattr(app, INSTALLED_ATTR, True)
    app.on_after_finalize.connect(_on_finalize, weak=False)
    if app.finalized:
        _patch_tasks(app)
    signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="celery_anarchon.worker_init")
    signals.worker_process_init.connect(_on_process_init, weak=False,
                                        dispatch_uid="celery_anarchon.worker_process_init")


def _on_finalize(sender, **kwargs) -> None:
    _patch_tasks(sender)


def _on_worker_init(sender=None, **kwargs) -> None:
    app = getattr(sender, "app", None)
    if app is None or not is_installed(app):
        return
    _patch_tasks(app)
    pool = getattr(sender, "pool_cls", None)
    name = getattr(pool, "__module__", "") or str(pool)
    if "eventlet" in name or "gevent" in name:
        logger.warning(
            "celery_anarchon: under the %s pool the lease heartbeat runs as a green thread: it "
            "renews leases only while tasks yield to the hub (I/O). A leased task that computes "
            "for longer than duration - heartbeat without yielding loses its lease and is taken "
            "over. Use the prefork, threads or solo pool for CPU-bound leased tasks.", name.split(".")[-1])
    else:
        logger.info("celery_anarchon: lease heartbeats run as threads in the executing process")
    try:
        worker_metrics.start_exporter(app, name)
    except ConfigError as exc:   # Celery would swallow it: say it, the worker runs without
        logger.error("celery_anarchon: no worker lease metrics: %s", exc)


def _on_process_init(**kwargs) -> None:
    _stores.clear()           # never reuse the parent's connections


# -- the safety net of the `celery` command ------------------------------------------------------

def _uses_anarchon(app) -> bool:
    conf = app.conf
    if "anarchon" in str(conf.get("beat_scheduler") or ""):
        return True
    if any(isinstance(k, str) and k.startswith("anarchon_") for k in conf.keys()):
        return True
    return any(isinstance(item, dict) and "anarchon" in (item.get("options") or {})
               for item in (conf.get("beat_schedule") or {}).values())


def _safety_net(sender=None, **kwargs) -> None:
    """A worker started by the ``celery`` command whose app uses celery_anarchon but whose app
    module forgot ``celery_anarchon.install(app)`` gets the worker side anyway: without it a
    leased run's body would run once per attempt. (A worker started another way has no such net:
    beat refuses to start without install(app), and the docs say where the line goes.)"""
    app = getattr(sender, "app", None)
    if app is None or is_installed(app) or not _uses_anarchon(app):
        return
    install(app)
    logger.warning("celery_anarchon: the app module of this worker does not call "
                   "celery_anarchon.install(app); installed the worker side of leases for this "
                   "worker. Only entries with a lease need it (one added at run time too): add "
                   "the call to the app module so every process that loads it has it.")


def _unprotected_leased_message(sender=None, task=None, **kwargs) -> None:
    """Say so when a leased run's message reaches a task without the worker side (it cannot be
    stopped from a signal: Celery swallows exceptions raised in handlers)."""
    headers = getattr(getattr(task, "request", None), "headers", None) or {}
    if HEADER_TOKEN in headers and not type(task).__dict__.get(_PATCHED_ATTR):
        logger.error("celery_anarchon: task %s runs a leased run (entry %s) on a worker without "
                     "the worker side of leases: nothing stops a second attempt from running its "
                     "body too. Call celery_anarchon.install(app) in the app module.",
                     getattr(task, "name", "?"), headers.get(HEADER_ENTRY))


def connect_command_signals() -> None:
    """Connect the safety net to Celery's signals (idempotent). Called when the ``celery`` command
    loads :mod:`celery_anarchon.operate.cli` (its ``celery.commands`` entry point), so it covers every
    worker the command starts."""
    signals.worker_init.connect(_safety_net, weak=False,
                                dispatch_uid="celery_anarchon.worker.leases.safety_net")
    signals.task_prerun.connect(_unprotected_leased_message, weak=False,
                                dispatch_uid="celery_anarchon.worker.leases.unprotected_leased_message")


def _patch_tasks(app) -> None:
    for task in list(app.tasks.values()):
        cls = type(task)
        if cls.__dict__.get(_PATCHED_ATTR) or cls.__module__.startswith("celery."):
            continue
        cls.__call__ = _leased_call(cls.__call__, task_has_custom(task, "__call__"))
        cls.retry = _leased_retry(cls.retry)
        setattr(cls, _PATCHED_ATTR, True)


# -- the call path ----------------------------------------------------------------------------------

def _leased_call(original, had_custom_call: bool):
    """Wrap a task class's ``__call__``. In the worker, Celery's tracer calls ``task.run``
    directly unless ``__call__`` is customised; ours is, so for a task that had no ``__call__`` of
    its own the body is ``self.run`` (Task.__call__ would push an empty request)."""
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        request = self.request
        if request.called_directly:               # a plain function call, not a message
            return original(self, *args, **kwargs)
        body = functools.partial(original, self) if had_custom_call else self.run
        headers = getattr(request, "headers", None) or {}
        if HEADER_TOKEN not in headers:
            return body(*args, **kwargs)
        lease = _adopt(self, request, headers)
        _local.lease = lease
        heartbeat = _Heartbeat(self.app, headers[HEADER_NAMESPACE], lease)
        heartbeat.start()
        try:
            result = body(*args, **kwargs)
        except Retry:
            heartbeat.stop()          # handed back by retry() before the retry was published
            raise
        except Reject as exc:
            if exc.requeue:
                heartbeat.stop()
                _hand_back(self.app, headers, lease, 0)
            else:
                heartbeat.release()   # renewing while the release is retried, as below
            raise
        except Exception:
            heartbeat.release()       # failed for good: the run is finished
            raise
        except BaseException:
            heartbeat.stop()          # SystemExit, KeyboardInterrupt: let the lease expire
            raise
        else:
            heartbeat.release()
            return result
        finally:
            _local.lease = None
    __call__._anarchon_wrapped = True
    return __call__


def _leased_retry(original):
    @functools.wraps(original)
    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None,
              max_retries=None, **options):
        lease = current_lease()
        request = self.request
        headers = getattr(request, "headers", None) or {}
        if lease is not None and HEADER_TOKEN in headers and not request.called_directly:
            limit = self.max_retries if max_retries is None else max_retries
            if limit is None or request.retries + 1 <= limit:
                if eta is not None:
                    aware = eta if eta.tzinfo else eta.replace(tzinfo=timezone.utc)
                    delay = max(0.0, (aware - datetime.now(timezone.utc)).total_seconds())
                else:
                    delay = float(countdown if countdown is not None else self.default_retry_delay or 0)
                _hand_back(self.app, headers, lease, delay)
        return original(self, args, kwargs, exc, throw, eta, countdown, max_retries, **options)
    return retry


def _lease_settings(headers) -> tuple[float, float, float]:
    settings = headers.get(HEADER_LEASE) or {}
    return (float(settings.get("duration", 30)), float(settings.get("heartbeat", 5)),
            float(settings.get("queue_timeout", 300)))


def _adopt(task, request, headers) -> Lease:
    """Adopt the run of this message, or drop the message (raise ``Ignore``)."""
    entry, slot = headers[HEADER_ENTRY], int(headers[HEADER_SLOT])
    attempt = int(headers.get(HEADER_ATTEMPT) or 1)
    duration, heartbeat, _ = _lease_settings(headers)
    owner = f"{socket.gethostname()}:{os.getpid()}:{request.id}:{request.retries}:{secrets.token_hex(3)}"
    store = _store(task.app, headers[HEADER_NAMESPACE])
    adopted = run = None
    for _ in range(3):       # a retried adopt whose first answer was lost finds itself the owner
        try:
            adopted, run = store.leases.adopt(entry, slot, owner, int(duration * 1000))
            break
        except StoreError as exc:
            error = exc
            time.sleep(0.2)
    else:
        _count(task.app, "dropped_store_unreachable")
        logger.error("%s: slot %s attempt %d not run: the store could not be reached to adopt the "
                     "run (%s). Beat takes it over after its queue deadline.", entry, slot, attempt, error)
        raise Ignore()
    if not adopted and run is not None and run.owner == owner and run.state is RunState.STARTED:
        adopted = True
    if not adopted and run is not None and run.state is RunState.PAUSED:
        _count(task.app, "dropped_paused")
        logger.warning("%s: dropped a message of slot %s (attempt %d, task %s) without running it: "
                       "the entry is paused, so the run ends before it started (recorded paused "
                       "in the store's history; not caught up after the resume).", entry, slot,
                       attempt, request.id)
        raise Ignore()
    if not adopted:
        state = run.state.value if run is not None else f"unknown to the store {store.safe_url}"
        _count(task.app, "dropped")
        logger.warning("%s: dropped a message of slot %s (attempt %d, task %s) without running it: "
                       "the run is %s%s.", entry, slot, attempt, request.id, state,
                       f" (attempt {run.attempt}, owner {run.owner})" if run is not None else "")
        raise Ignore()
    _count(task.app, "adopted")
    return Lease(entry, slot, run.attempt, run.token, owner, duration, heartbeat,
                 run.lease_expires_ms or 0)


def _hand_back(app, headers, lease: Lease, delay_s: float) -> None:
    """A retry: queued again by token, deadline = the retry's ETA + queue_timeout."""
    _, _, queue_timeout = _lease_settings(headers)
    store = _store(app, headers[HEADER_NAMESPACE])
    heartbeat = getattr(_local, "heartbeat", None)
    if heartbeat is not None:
        heartbeat.stop()
    try:
        if store.leases.requeue(lease.entry, lease.slot_ms, lease.token, delay_ms=int(delay_s * 1000),
                         queue_timeout_ms=int(queue_timeout * 1000)):
            _count(app, "handed_back")
            return
        logger.warning("%s: slot %s: could not hand the run back for its retry: the lease was "
                       "taken over", lease.entry, lease.slot_ms)
    except StoreError as exc:
        logger.error("%s: slot %s: could not hand the run back for its retry (%s); its retry "
                     "may be dropped and the run taken over after its lease", lease.entry,
                     lease.slot_ms, exc)


def _store(app, namespace: str):
    """This process's store for ``namespace`` (opened on first use, never shared across a fork);
    one that holds leases (:func:`~celery_anarchon.stores.base.lease_store`, else ConfigError)."""
    key = (os.getpid(), namespace)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            from celery_anarchon.settings import Settings, open_app_store
            store = open_app_store(
                Settings.from_app(app, check_timezone=False), namespace=namespace,
                instance_id=f"worker:{socket.gethostname()}:{os.getpid()}")
            lease_store(store)
            _stores[key] = store
            _name_store(store)
        return store


def _name_store(store) -> None:
    """Say once per process which store the worker side uses: its URL as the store resolved it
    (a relative SQLite path made absolute against this process's working directory, once, as beat
    does) and, for a relative SQLite path, the warning beat gives at start-up: a worker in another
    directory than beat adopts in another file (docs/stores.md "SQLite")."""
    named = (os.getpid(), store.safe_url)
    if named in _named:
        return
    _named.add(named)
    logger.info("celery_anarchon: the worker side adopts, renews and releases leased runs in the "
                "%s store %s", store.kind, store.safe_url)
    relative_warning = getattr(store, "relative_warning", None)
    warning = relative_warning() if relative_warning is not None else None
    if warning:
        logger.warning("celery_anarchon: %s", warning)


class _Heartbeat:
    """Renews one lease every ``heartbeat`` seconds from a thread of the executing process."""

    def __init__(self, app, namespace: str, lease: Lease) -> None:
        self.app, self.namespace, self.lease = app, namespace, lease
        self._stop = threading.Event()
        self._finishing = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"anarchon-heartbeat-{lease.entry}")
        _local.heartbeat = self

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.lease.heartbeat_s + 1)
        _local.heartbeat = None

    def _run(self) -> None:
        lease = self.lease
        store = _store(self.app, self.namespace)
        wait, failing = lease.heartbeat_s, False
        while not self._stop.wait(wait):
            wait = lease.heartbeat_s
            try:
                run = store.leases.renew(lease.entry, lease.slot_ms, lease.token, lease.owner,
                                  int(lease.duration_s * 1000))
            except StoreError as exc:
                _count(self.app, "renew_failed")
                if not failing:           # one line per outage, not one per try
                    logger.warning("%s: slot %s: lease renewal failed (%s); retrying every %g s",
                                   lease.entry, lease.slot_ms, exc, RELEASE_RETRY_S)
                failing = True
                wait = min(RELEASE_RETRY_S, lease.heartbeat_s)  # renew as soon as the store is back
                continue
            if run is None:
                if self._finishing:   # the body is done and being released: not a lost lease
                    return
                lease.lost = True
                _count(self.app, "lost")
                logger.warning("%s: slot %s attempt %d lost its lease (token %d): the run was taken "
                               "over by another attempt. current_lease().check() raises LeaseLost.",
                               lease.entry, lease.slot_ms, lease.attempt, lease.token)
                return
            _count(self.app, "renewed")
            if failing:
                logger.warning("%s: slot %s: lease renewed again", lease.entry, lease.slot_ms)
                failing = False
            lease.expires_ms = run.lease_expires_ms or lease.expires_ms

    def release(self) -> None:
        """Mark the run finished, by token, then stop renewing. If the store does not answer, try
        again every 0.2 s for ``RELEASE_PATIENCE_S`` or two lease durations, whichever is longer
        (the heartbeat keeps renewing meanwhile): a lease that runs out while its release is stuck would let beat take a
        finished run over and run its body a second time. The task's result waits meanwhile."""
        lease = self.lease
        store = _store(self.app, self.namespace)
        self._finishing = True
        started = time.monotonic()
        deadline = started + max(RELEASE_PATIENCE_S, 2 * lease.duration_s)
        failures = 0
        while True:
            try:
                released = store.leases.release(lease.entry, lease.slot_ms, lease.token)
                break
            except StoreError as exc:
                failures += 1
                if failures == 1:
                    logger.warning("%s: slot %s: the lease could not be released (%s); retrying "
                                   "every %g s", lease.entry, lease.slot_ms, exc, RELEASE_RETRY_S)
                if time.monotonic() > deadline:
                    self.stop()
                    _count(self.app, "release_failed")
                    logger.error("%s: slot %s: could not release the lease for %.0f s (%s); the "
                                 "run may be taken over and run again", lease.entry, lease.slot_ms,
                                 time.monotonic() - started, exc)
                    return
                time.sleep(RELEASE_RETRY_S)
        self.stop()
        if failures:
            logger.warning("%s: slot %s: lease released after %.1f s of retries", lease.entry,
                           lease.slot_ms, time.monotonic() - started)
        _count(self.app, "released" if released else "release_refused")
        if not released:
            logger.warning("%s: slot %s attempt %d finished, but its lease had been taken over",
                           lease.entry, lease.slot_ms, lease.attempt)
