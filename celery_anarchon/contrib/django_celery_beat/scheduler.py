"""Our Scheduler on django-celery-beat's models: the entries are the app's ``beat_schedule``
plus the ``PeriodicTask`` rows, read at start-up and again whenever django-celery-beat's own
change tracking (``PeriodicTasks.last_change()``) moves, polled every ``anarchon_sync_interval``.

The Django ORM is called between the engine's ticks, never inside one: the poll before a tick
(:meth:`RowPlans.changed`), the rows' updates of the runs this instance won and sent after it
(:meth:`Scheduler.tick`). Stale database connections are closed before each, as
django-celery-beat's ``DatabaseScheduler`` does (``close_old_connections``).
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import time

from celery_anarchon import django_rows
from celery_anarchon.beat.entries import EntryPlans
from celery_anarchon.beat.publisher import Publisher
from celery_anarchon.beat.scheduler import Scheduler as AnarchonScheduler
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule import plan as plans_mod
from celery_anarchon.schedule.plan import EntryPlan

logger = logging.getLogger("celery_anarchon.contrib.django_celery_beat")

#: the rows are read at least this often, seconds, even when PeriodicTasks.last_change() did not
#: move (a write that sent no signal: a bulk update() or a fixture); django-celery-beat's
#: DatabaseScheduler does the same (its SCHEDULE_SYNC_MAX_INTERVAL)
FULL_READ_S = 300.0
#: how beat_scheduler names this Scheduler
SCHEDULER_PATH = "celery_anarchon.contrib.django_celery_beat:Scheduler"
#: the most runs whose row updates wait for a database that refused them (older ones are dropped,
#: logged): the counts are a record, never a decision
MAX_PENDING_RUNS = 10_000


def _django_ready() -> None:
    """Django set up with django-celery-beat (:func:`celery_anarchon.django_rows.ready`).

    :raises ConfigError: naming what is missing and the fix.
    """
    django_rows.ready(SCHEDULER_PATH)


class RowPlans(EntryPlans):
    """The plans of ``beat_schedule`` (as :class:`EntryPlans`) and of the ``PeriodicTask`` rows.

    A ``beat_schedule`` entry wins a name clash with a row (django-celery-beat's own scheduler
    copies ``beat_schedule`` into rows of the same names): the row is left out, with a warning.
    A row our rules refuse is left out with an error naming it, its id and the fix; the others
    run (:attr:`refused` holds the errors, by row name).

    A disabled row whose name is paused in the store (the admin pauses a row before it disables
    it) is kept as a held plan (:attr:`~celery_anarchon.schedule.plan.EntryPlan.held`): never
    claimed, each slot its pause holds recorded ``paused``, as a paused entry's are. The paused
    names come from the engine's sync (:meth:`of_store`); when they change, the rows are read
    again at the next poll.
    """

    def __init__(self, app, settings, store, entry_cls) -> None:
        super().__init__(app, settings, store, entry_cls)
        self.sync_interval_s = settings.sync_interval_s
        self._config: dict[str, EntryPlan] = {}
        self._rows: dict[str, EntryPlan] = {}
        #: PeriodicTasks.last_change() when the rows were last read (a sentinel: never read)
        self._seen: object = self
        #: read the rows once more at the next poll: django-celery-beat notes a change before
        #: the row's own write (a pre_save signal), which may not have been committed yet
        self._again = False
        self.polled_at = 0.0
        self._read_at = 0.0                 #: monotonic: when the rows were last read
        #: the rows left out, by name: the error that refused each
        self.refused: dict[str, str] = {}
        #: the names paused in the store, as the engine's last sync that loaded saw them
        self._paused: frozenset[str] = frozenset()

    def of_schedule(self, schedule: dict) -> dict[str, EntryPlan]:
        """The plans of ``beat_schedule`` and of the rows (read now).

        :raises ConfigError: a ``beat_schedule`` entry is misconfigured, or Django is not set up
            with django-celery-beat (:func:`_django_ready`); a row never raises.
        """
        self._config = super().of_schedule(schedule)
        _django_ready()
        self._poll(force=True)
        return {**self._rows, **self._config}

    def changed(self, schedule: dict, equal) -> dict[str, EntryPlan] | None:
        """The new plans when ``beat_schedule`` changed (:meth:`EntryPlans.changed`) or the rows
        did (polled every ``anarchon_sync_interval``), else ``None``.

        :raises ConfigError: the changed ``beat_schedule`` is not valid.
        """
        config = super().changed(schedule, equal)
        if config is not None:
            self._config = config
        if not self._poll() and config is None:
            return None
        return {**self._rows, **self._config}

    def of_store(self, snapshot) -> dict[str, EntryPlan]:
        """:meth:`EntryPlans.of_store`, noting the names paused in the store: when they changed,
        the rows are read again at the next poll (a disabled row is held while it is paused)."""
        paused = frozenset(name for name, stored in snapshot.entries.items()
                           if stored.pause is not None)
        if paused != self._paused:
            self._paused, self._again = paused, True
        return super().of_store(snapshot)

    @property
    def row_names(self) -> frozenset[str]:
        """The names of the rows scheduled now (held ones too)."""
        return frozenset(self._rows)

    def next_poll_in(self) -> float:
        """Seconds until the next poll of the rows is due."""
        return max(0.0, self.polled_at + self.sync_interval_s - time.monotonic())

    def _poll(self, force: bool = False) -> bool:
        """Read the rows when ``PeriodicTasks.last_change()`` moved (asked at most every sync
        interval), and every :data:`FULL_READ_S` anyway; a database error is logged and the rows
        known are kept.

        :returns: whether the rows were read.
        """
        now = time.monotonic()
        if not force and now - self.polled_at < self.sync_interval_s:
            return False
        self.polled_at = now
        from django.db import DatabaseError, InterfaceError, close_old_connections
        try:
            _django_ready()
            from django_celery_beat.models import PeriodicTask, PeriodicTasks
            close_old_connections()
            change = PeriodicTasks.last_change()
            if change == self._seen and not self._again and now - self._read_at < FULL_READ_S:
                return False
            rows = list(PeriodicTask.objects.filter(enabled=True).select_related(*_FIELDS))
            held = [name for name in PeriodicTask.objects.filter(enabled=False).values_list(
                "name", flat=True) if name in self._paused] if self._paused else []
            held_rows = list(PeriodicTask.objects.filter(enabled=False, name__in=held)
                             .select_related(*_FIELDS)) if held else []
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("anarchon: reading django-celery-beat's PeriodicTask rows failed (%s);"
                           " keeping the %d rows read before, trying again in %g s", exc,
                           len(self._rows), self.sync_interval_s)
            return False
        self._again = change != self._seen
        self._seen, self._read_at = change, now
        self._rows = self._build_rows(rows)
        self._rows.update(self._held_rows(held_rows))
        logger.info("anarchon: read %d django-celery-beat PeriodicTask rows: %d scheduled, %d "
                    "left out", len(rows), len(self._rows), len(self.refused))
        return True

    def _build_rows(self, rows: list) -> dict[str, EntryPlan]:
        from celery_anarchon.django_rows.rows import name_refusal, row_entry, row_fix, where
        plans, refused, known = {}, {}, {}
        for row in rows:
            if row.name in self._config:
                logger.warning("anarchon: %s is left out: beat_schedule has an entry of that name,"
                               " which runs instead; fix: delete the row or rename it", where(row))
                continue
            unnormalized = name_refusal(row, rows)
            if unnormalized is not None:
                refused[row.name] = unnormalized
                logger.error("anarchon: %s (the others run)", unnormalized)
                continue
            try:
                entry = row_entry(row, app=self.app)
                if entry is None:
                    continue
                plans[row.name] = plans_mod.build_plan(row.name, entry, app=self.app,
                                                       settings=self.settings, store=self.store,
                                                       known=known)
            except Exception as exc:       # a row never stops the others
                reason = str(exc).removeprefix(f"{where(row)}: ")
                refused[row.name] = f"{where(row)} is left out: {row_fix(reason)}"
                logger.error("anarchon: %s (the others run)", refused[row.name],
                             exc_info=not isinstance(exc, ConfigError))
        self.refused = refused
        return plans


    def _held_rows(self, rows: list) -> dict[str, EntryPlan]:
        """The held plans of disabled rows paused in the store (a row whose name another entry
        runs under, or that our rules refuse, is left out: it runs nowhere either)."""
        from celery_anarchon.django_rows.rows import name_refusal, row_entry
        plans, known = {}, {}
        for row in rows:
            if row.name in self._config or row.name in self._rows or name_refusal(row, rows):
                continue
            try:
                entry = row_entry(row, app=self.app, scheduled_only=False)
                plan = plans_mod.build_plan(row.name, entry, app=self.app,
                                            settings=self.settings, store=self.store, known=known)
            except Exception as exc:       # disabled: nothing to report but why it is not held
                logger.debug("anarchon: disabled row %r is not held: %s", row.name, exc)
                continue
            plans[row.name] = dataclasses.replace(plan, held=True)
        return plans


_FIELDS = ("interval", "crontab", "solar", "clocked")


class RowPublisher(Publisher):
    """The broker side, noting each run of a row that this instance won and sent
    (:attr:`sent`), for the row's update after the tick."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list = []

    def send(self, plan, slot_ms: int, attempt: int, token, task_id: str) -> None:
        """:meth:`Publisher.send`; a row's first attempt sent is noted in :attr:`sent` (an
        error raised by the send notes nothing: the run was not sent, or may not have been)."""
        super().send(plan, slot_ms, attempt, token, task_id)
        row_id = getattr(plan.entry, "row_id", None)
        if row_id is not None and attempt == 1:
            from celery_anarchon.django_rows.rows import SentRun
            self.sent.append(SentRun(row_id, plan.entry.one_off,
                                     datetime.datetime.now(datetime.timezone.utc)))


class Scheduler(AnarchonScheduler):
    """celery_anarchon's Scheduler with django-celery-beat's ``PeriodicTask`` rows as entries,
    beside ``beat_schedule``: ``beat_scheduler =
    "celery_anarchon.contrib.django_celery_beat:Scheduler"`` on every host. Each run is claimed
    in the store like any other; the instance that won and sent it updates the row's
    ``last_run_at`` and ``total_run_count`` (and disables a one-off row) after its tick, never
    on the claim path: a failed update is logged and tried again at the next tick.

    :raises ConfigError: at start-up, as :class:`celery_anarchon.Scheduler` (a row never does).
    """

    EntryPlans = RowPlans
    Publisher = RowPublisher

    @property
    def info(self) -> str:
        """Banner lines: :class:`celery_anarchon.Scheduler`'s, and where the rows come from."""
        return (f"{super().info}\n    . rows -> django-celery-beat's PeriodicTask, read when "
                f"PeriodicTasks.last_change() moves (asked every "
                f"{self._settings.sync_interval_s:g} s)")

    def tick(self, *args, **kwargs) -> float:
        """One tick of :class:`celery_anarchon.Scheduler`, then the rows' updates of the runs it
        sent.

        :returns: seconds to sleep, at most until the next poll of the rows.
        """
        try:
            delay = super().tick(*args, **kwargs)
        finally:
            self._record_sent()
        self._mark_followed(self.engine)
        return min(delay, max(self.entry_plans.next_poll_in(), 0.05))

    def _make_engine(self, plans: dict, *, forked: bool = False):
        """:class:`celery_anarchon.Scheduler`'s engine, its rows marked followed."""
        engine = super()._make_engine(plans, forked=forked)
        self._mark_followed(engine)
        return engine

    def _mark_followed(self, engine) -> None:
        """The rows are followed at run time, each instance at its own poll: the instances'
        disagreement on a row is reported only once it outlasts a poll or two (the engine's
        heartbeat, :attr:`~celery_anarchon.beat.engine.instances.Heartbeat.followed`). The rows
        our rules refuse go into this instance's record, where ``status`` shows them
        (:attr:`~celery_anarchon.beat.engine.instances.Heartbeat.refused`)."""
        heartbeat = getattr(engine, "heartbeat", None)
        if heartbeat is not None:
            heartbeat.followed = self.entry_plans.row_names
            heartbeat.refused = self.entry_plans.refused   # shown by status (its "refused")

    def _record_sent(self) -> None:
        publisher = self._publisher
        if publisher is None or not publisher.sent:
            return
        sent, publisher.sent = publisher.sent, []
        from django.db import DatabaseError, InterfaceError, close_old_connections

        from celery_anarchon.django_rows.rows import record_runs
        try:
            close_old_connections()
            record_runs(sent)
        except (DatabaseError, InterfaceError) as exc:
            kept = (sent + publisher.sent)[-MAX_PENDING_RUNS:]
            logger.error("anarchon: updating last_run_at / total_run_count of %d sent runs failed "
                         "(%s); the runs were sent, the rows are updated at the next tick%s", len(sent),
                         exc, "" if len(kept) == len(sent) + len(publisher.sent)
                         else f" ({len(sent) + len(publisher.sent) - len(kept)} dropped)")
            publisher.sent = kept
