"""The Celery beat ``Scheduler``: thin glue between Celery and the :class:`~celery_anarchon.beat.engine.Engine`.

Use it on every host::

    app.conf.beat_scheduler = "celery_anarchon:Scheduler"     # or: celery beat -S anarchon

Celery builds a scheduler twice under ``celery beat`` (a ``lazy=True`` instance for the banner,
which opens nothing, then the real one) and once under ``celery worker -B`` (in the forked Beat
child). Connections are opened lazily in the process that ticks. Beat's shelve file is not used:
the store is the only state shared between instances. The Scheduler holds the parts and hands
them to the engine: the broker side (connection, producer, send batches, the send of a won run)
is :class:`~celery_anarchon.beat.publisher.Publisher`, the plans of the entries
:class:`~celery_anarchon.beat.entries.EntryPlans`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

import click
from celery import beat

from celery_anarchon.schedule import plan as plans_mod
from celery_anarchon._util import mask_url, paused_gc
from celery_anarchon.settings import Settings, make_instance_id, open_app_store
from celery_anarchon.beat.entries import BeatEntry, EntryPlans
from celery_anarchon.beat.publisher import Publisher, _exit_requested
from celery_anarchon.beat.engine import MAX_SLEEP_S, Engine
from celery_anarchon.errors import ConfigError
from celery_anarchon.beat.metrics import process_observer, require_client
from celery_anarchon.stores import ClaimStore, open_store, scheme_of
from celery_anarchon.schedule.timing import check_sync_interval

logger = logging.getLogger("celery_anarchon.beat.scheduler")


def _stderr_is_logged() -> bool:
    """True when ``sys.stderr`` is Celery's :class:`~celery.utils.log.LoggingProxy` (beat and the
    worker redirect it into the log once logging is set up)."""
    from celery.utils.log import LoggingProxy
    return isinstance(sys.stderr, LoggingProxy)


def refuse_a_store_of_one_process(app, store: ClaimStore) -> None:
    """Beat takes a store that lives in one process (``memory://``, :attr:`one_process`) only in a
    test app: one whose broker is kombu's in-memory transport (``broker_url = "memory://"``), one
    process only as well (docs/stores.md "memory://"). Anywhere else the beat of every other
    process would send every run too, and no worker could adopt a leased run.

    :raises ConfigError: naming the setting, its value, the broker and the fix.
    """
    if not getattr(store, "one_process", False):
        return
    broker = app.conf.broker_url or app.conf.broker_read_url or ""
    if broker and scheme_of(broker) == "memory":
        return
    raise ConfigError(
        f"anarchon_store_url = {store.safe_url!r}: the memory store lives in this process only "
        "(beat in another process would send every run again, and no worker could adopt a leased "
        "run): beat takes it only in a test app, whose broker_url is 'memory://' (this app's is "
        f"{mask_url(broker) if broker else 'unset'!r}); fix: set anarchon_store_url to a store "
        "every beat and worker reaches, e.g. 'redis://host:6379/0' or "
        "'postgresql://user@host/db', or, in a test, use broker_url = 'memory://'")


class BeatCannotStart(ConfigError, click.ClickException):
    """A :class:`ConfigError` met while beat builds this scheduler, outside beat's log: Celery
    builds one for its banner before it redirects stderr into the log, and its command line
    (click) prints this as one ``Error:`` line and exits 1 instead of printing a traceback.
    Still a ConfigError (and a ValueError) for code that builds a Scheduler itself."""

    def __init__(self, error: ConfigError) -> None:
        message = f"anarchon: beat cannot start: {error}"
        ConfigError.__init__(self, message)
        click.ClickException.__init__(self, message)


class Scheduler(beat.Scheduler):
    """A beat scheduler that runs on every host: each run is claimed once in a shared store.

    Settings (Celery configuration; seconds): ``anarchon_store_url``, ``anarchon_store_options``,
    ``anarchon_namespace``, ``anarchon_jitter``, ``anarchon_max_late``, ``anarchon_lease``,
    ``anarchon_heartbeat``, ``anarchon_sync_interval``, ``anarchon_metrics_port`` (Prometheus
    metrics of this process: :mod:`celery_anarchon.beat.metrics`); per entry
    ``options={"anarchon": {...}}`` (see docs/configuration). On a store that holds entries, the
    store's entries run too.

    :raises ConfigError: at start-up, for any unsafe or invalid setting or entry.
    """

    #: beat never sleeps longer than this between ticks, seconds (docs/design.md: at most 60 s)
    max_interval = MAX_SLEEP_S
    #: the class of the entries (Celery's name)
    Entry = BeatEntry
    #: the class of the broker side (a subclass may swap it, as it may ``Entry``)
    Publisher = Publisher
    #: the class of the entries' plans (a subclass may swap it: another source of entries)
    EntryPlans = EntryPlans

    def __init__(self, app, *args, lazy: bool = False, **kwargs) -> None:
        try:
            self._construct(app, *args, lazy=lazy, **kwargs)
        except ConfigError as exc:
            if not _stderr_is_logged():
                raise BeatCannotStart(exc) from exc
            # beat's Service builds this scheduler after it redirected stderr into the log: the
            # traceback Python prints on the way out would become one WARNING line per fragment
            logger.critical("anarchon: beat cannot start: %s", exc)
            raise SystemExit(1) from exc

    def _construct(self, app, *args, lazy: bool, **kwargs) -> None:
        self._settings = Settings.from_app(app)
        require_client(self._settings)
        self._pid = os.getpid()
        self._instance_id = make_instance_id()
        self.store = open_app_store(self._settings, instance_id=self._instance_id)
        refuse_a_store_of_one_process(app, self.store)
        # the store's own URL: a relative SQLite path resolved once, here (a fork reopens it)
        self._store_url, self._store_options = self.store.url, self._settings.store_options
        self.engine: Engine | None = None
        self.entry_plans = self.EntryPlans(app, self._settings, self.store, self.Entry)
        self._publisher: Publisher | None = None
        self._closing = False
        self._in_tick = False
        self._ticked = False
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- Celery's Scheduler interface -------------------------------------------------------------
    def setup_schedule(self) -> None:
        """Merge ``beat_schedule``, keep Celery's default entries, check every entry, and prepare
        the store (an unreachable store is retried by the ticks; beat keeps running).

        :raises ConfigError: naming each misconfigured entry, or a store that refuses the
            configuration (e.g. a Redis too old for the ``idmp`` strategy).
        """
        with paused_gc():   # a build of many objects, no cyclic garbage (the first tick's too)
            # merge first, then add the defaults: the other order drops celery.backend_cleanup
            self.merge_inplace(plans_mod.beat_schedule_of(self.app.conf.beat_schedule))
            self.install_default_entries(self.data)
            plans = self.entry_plans.of_schedule(self.schedule)
            if self.store.entries is not None:
                check_sync_interval(self._settings, self.store.memory)
            if self._settings.store_warning:
                logger.warning(self._settings.store_warning)
            self.engine = self._make_engine(plans)
            self.engine.start()
        logger.info("anarchon: instance %s, store %s, namespace %r, %d entries%s",
                    self._instance_id, self.store.safe_url, self._settings.namespace, len(plans),
                    f", store entries followed every {self._settings.sync_interval_s:g} s"
                    if self.engine.sync is not None else "")

    def merge_inplace(self, b) -> None:
        """Celery's merge, with an entry Celery cannot build (an unknown key, a schedule object
        it cannot use) reported by name instead of a bare ``TypeError``.

        :raises ConfigError: naming each entry and what Celery said about it.
        """
        try:
            return super().merge_inplace(b)
        except Exception as exc:           # which entry? each is built alone to name it
            failed = exc
        problems = []
        for name, item in (b or {}).items():
            try:
                self.Entry(**dict(item, name=name, app=self.app))
            except Exception as exc:
                problems.append(str(plans_mod.cannot_build(name, item, exc)))
        if problems:
            raise ConfigError("\n".join(problems))
        raise failed

    def _make_engine(self, plans: dict, *, forked: bool = False) -> Engine:
        """The engine of this process; with ``anarchon_metrics_port`` set, its observer is this
        process's Prometheus metrics, whose exporter starts here (once per process).

        :param forked: a process forked after start-up: a metrics port its parent still holds is
            logged, and this process runs without metrics (a tick must not fail on it forever).
        :raises ConfigError: the metrics port is in use (at start-up).
        """
        try:
            observer = process_observer(self._settings, instance_id=self._instance_id,
                                        namespace=self._settings.namespace)
        except ConfigError as exc:
            if not forked:
                raise
            logger.error("anarchon: no metrics in this forked beat process: %s", exc)
            observer = None
        if observer is not None:
            logger.info("anarchon: metrics on http://%s:%d/metrics", self._settings.metrics_addr,
                        self._settings.metrics_port)
        publisher = self.publisher
        return Engine(self.store, plans, instance_id=self._instance_id,
                      namespace=self._settings.namespace, send=publisher.send,
                      sync_interval_s=self._settings.sync_interval_s,
                      build_store_plans=self.entry_plans.of_store, observer=observer,
                      send_batch=publisher.send_batch)

    def tick(self, *args, **kwargs) -> float:
        """One iteration: claim and send what is due. Never raises: a failure is logged and
        retried after a short delay, and beat keeps running.

        :returns: seconds to sleep before the next tick (at most ``max_interval`` and 60 s).
        """
        self._in_tick = True
        try:
            self._follow_fork()
            if self.engine is None:
                self.setup_schedule()
            self._follow_schedule_changes()
            with paused_gc() if not self._ticked else contextlib.nullcontext():
                delay = self.engine.tick()
            self._ticked = True
        except Exception as exc:
            if self._closing or _exit_requested(exc):
                raise SystemExit("beat is shutting down") from exc
            logger.exception("anarchon: tick failed; trying again in 5 s")
            delay = 5.0
        finally:
            self._in_tick = False
        if self._closing:       # close() ran during this tick (beat's SIGTERM handler)
            raise SystemExit("beat is shutting down")
        return min(delay, float(self.max_interval or MAX_SLEEP_S), MAX_SLEEP_S)

    def close(self) -> None:
        """Release the store and the broker connection. Safe to call twice. Beat's SIGTERM
        handler calls it in the middle of a tick, then raises ``SystemExit``, which a client
        library may turn into another error: the engine then sends nothing more and the tick
        ends beat with ``SystemExit`` (never a retried publish). Outside a tick the store and
        broker reopen lazily, and this instance's heartbeat is removed from an entry store
        (inside a tick the store may be in use: beat's second close, after the tick, does it)."""
        if self._in_tick:
            self._closing = True
            if self.engine is not None:
                self.engine.stop()
            if self._publisher is not None:
                self._publisher.stop()
        elif self.engine is not None:
            self.engine.close()
        try:
            self.store.close()
        finally:
            try:
                super().close()
            finally:
                if self._publisher is not None:
                    self._publisher.close()

    @property
    def publisher(self) -> Publisher:
        """This process's broker side (of the class :attr:`Publisher`), made on first use."""
        if self._publisher is None:
            self._publisher = self.Publisher(self.app, self.Producer,
                                             namespace=self._settings.namespace,
                                             instance_id=self._instance_id)
        return self._publisher

    @property
    def connection(self):
        """Beat's broker connection (Celery's name), the publisher's
        (:attr:`Publisher.connection <celery_anarchon.beat.publisher.Publisher.connection>`)."""
        return self.publisher.connection

    @property
    def producer(self):
        """Beat's producer (Celery's name), the publisher's
        (:attr:`Publisher.producer <celery_anarchon.beat.publisher.Publisher.producer>`)."""
        return self.publisher.producer

    @property
    def info(self) -> str:
        """Banner lines: store (password masked), namespace and timing defaults."""
        s = self._settings
        jitter = (f"{s.jitter_s:g} s" if s.jitter_s is not None
                  else "2 s (a quarter of the gap for short intervals)")
        memory = self.store.memory
        kept = "forever" if memory.duration_s is None else f"{memory.duration_s:g} s"
        return "\n".join([
            f"    . store -> {self.store.safe_url} ({self.store.kind}, remembers runs {kept})",
            f"    . namespace -> {s.namespace}",
            f"    . timing -> jitter {jitter}, max_late {s.max_late_s:g} s, "
            f"lease {s.lease_s:g} s, heartbeat {s.heartbeat_s:g} s, catch_up {s.catch_up}"
            + (f" (window {s.catch_up_window_s:g} s)" if s.catch_up == "all" else ""),
        ])

    # -- internals ------------------------------------------------------------------------------------
    def _follow_fork(self) -> None:
        """A process forked after construction gets its own instance id and store connections."""
        if os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        self._instance_id = make_instance_id()
        self.store = open_store(self._store_url, namespace=self._settings.namespace,
                                instance_id=self._instance_id, options=self._store_options)
        self.entry_plans.store = self.store
        self._publisher = None      # the parent's connection is the parent's: never released here
        if self.engine is not None:
            self.engine = self._make_engine(self.engine.config_plans, forked=True)

    def add(self, **kwargs):
        """Celery's ``add``; the new entry is scheduled at the next tick (checked like every
        entry)."""
        self.entry_plans.dirty = True
        return super().add(**kwargs)

    def update_from_dict(self, dict_) -> None:
        """Celery's ``update_from_dict``; the entries are scheduled at the next tick."""
        self.entry_plans.dirty = True
        super().update_from_dict(dict_)

    def _follow_schedule_changes(self) -> None:
        """Entries added or changed at run time (``add``, ``update_from_dict``, the dict changed
        directly) are checked and scheduled (:meth:`EntryPlans.changed
        <celery_anarchon.beat.entries.EntryPlans.changed>`: how often); a bad one is logged and
        left out, the others keep running."""
        try:
            plans = self.entry_plans.changed(self.schedule, self.schedules_equal)
        except ConfigError as exc:
            logger.error("anarchon: the changed schedule is not valid, keeping the previous one: %s", exc)
            return
        if plans is not None:
            self.engine.update_plans(plans)
