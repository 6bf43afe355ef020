"""``make demo-django``: django-celery-beat's rows on three beat instances and one worker of the
Django project ``djproj``, for about a minute and a half, with no server.

The script migrates djproj's SQLite database, creates ``PeriodicTask`` rows through the ORM (two
interval rows, a crontab row, one more interval row to disable), starts a worker and three
``celery -A djproj beat`` (``beat_scheduler = "celery_anarchon.contrib.django_celery_beat:Scheduler"``
in djproj/celery.py), then while they run adds a clocked one-off row, edits one row's interval and
disables another, as the admin would (djproj has celery_anarchon's admin module in
``INSTALLED_APPS``, so that save pauses the row in the store first: no instance sends it from
then on, even before it reads the rows again). The broker is kombu's SQLAlchemy transport on a
SQLite file and the claims go to the embedded SQLite store beside it (djproj/settings.py). The verdict: every
run sent exactly once, the one-off once at its instant, nothing sent once every beat read the
disabled row, and each row's ``total_run_count`` equal to the runs sent of it. Exit 1 otherwise.
"""
from __future__ import annotations

import collections
import datetime
import math
import os
import sys
import time

from demo import HERE, Demo, hhmmss

RUN = os.path.join(HERE, ".run-django")
SECONDS = float(os.environ.get("ANARCHON_DEMO_SECONDS", "60"))
BEATS = ("beat-1", "beat-2", "beat-3")
TASK = "djproj.tasks.record"
#: a beat's log line each time it read the rows
READ = "django-celery-beat PeriodicTask rows"
#: the longest jitter of an entry here, seconds (a quarter of the 2-s row's gap is less): a slot
#: this close before an edit may be claimed after it, by a beat that read the edit
JITTER_S = 2.0
#: the slack of a wait past what the timing allows (two busy cores); a wait ends as soon as its
#: condition holds
SLACK_S = 20.0


class DjangoDemo(Demo):
    """The demo's processes, the rows it writes and its verdict."""

    def __init__(self) -> None:
        super().__init__(RUN, app="djproj", env={"DJANGO_SETTINGS_MODULE": "djproj.settings"})
        #: name -> [(from_s, to_s, celery schedule)]: the runs a row must send, by phase
        self.phases: dict[str, list] = {}
        #: name -> epoch seconds after which it must send nothing
        self.silent_after: dict[str, float] = {}
        self.clocked_ms = 0

    def setup_django(self):
        """Django set up on djproj's settings in this process, the database migrated; djproj's
        Celery app."""
        os.environ["ANARCHON_DEMO_DIR"] = RUN
        os.environ["DJANGO_SETTINGS_MODULE"] = "djproj.settings"
        sys.path.insert(0, HERE)
        import django
        from django.core.management import call_command
        django.setup()
        call_command("migrate", verbosity=0, interactive=False)
        from djproj.celery import app
        return app

    def create_rows(self) -> None:
        from celery.schedules import crontab, schedule
        from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

        def every(n: int) -> IntervalSchedule:
            return IntervalSchedule.objects.get_or_create(every=n, period="seconds")[0]

        PeriodicTask.objects.create(name="heartbeat-every-2s", task=TASK, interval=every(2),
                                    args='["heartbeat"]')
        PeriodicTask.objects.create(name="billing-every-5s", task=TASK, interval=every(5),
                                    args='["billing"]')
        PeriodicTask.objects.create(name="report-every-3s", task=TASK, interval=every(3),
                                    kwargs='{"what": "report"}')
        minute = CrontabSchedule.objects.create(minute="*", hour="*", day_of_week="*",
                                                day_of_month="*", month_of_year="*",
                                                timezone="UTC")
        PeriodicTask.objects.create(name="cleanup-every-minute", task=TASK, crontab=minute,
                                    args='["cleanup"]')
        forever = float("inf")
        self.phases = {"heartbeat-every-2s": [(0, forever, schedule(2))],
                       "billing-every-5s": [(0, forever, schedule(5))],
                       "report-every-3s": [(0, forever, schedule(3))],
                       "cleanup-every-minute": [(0, forever, crontab())]}

    def all_read_again(self) -> float:
        """Wait until every beat read the rows twice since now (django-celery-beat notes a
        change just before the row's write: the first read may miss it); when, epoch seconds."""
        before = {b: self.celery.text(b).count(READ) for b in BEATS}
        deadline = time.time() + 2 * 1.0 + SLACK_S
        while not all(self.celery.text(b).count(READ) >= before[b] + 2 for b in BEATS):
            if time.time() > deadline:
                sys.exit(f"the beats did not read the changed rows within {SLACK_S} s:\n"
                         + self.celery.logs())
            self.show_new()
            time.sleep(0.2)
        return time.time()

    def add_clocked(self, at_s: float) -> None:
        from django_celery_beat.models import ClockedSchedule, PeriodicTask
        self.clocked_ms = math.ceil(at_s) * 1000
        at = datetime.datetime.fromtimestamp(self.clocked_ms / 1000, datetime.timezone.utc)
        PeriodicTask.objects.create(name="welcome-once", task=TASK, one_off=True,
                                    args='["welcome"]',
                                    clocked=ClockedSchedule.objects.create(clocked_time=at))
        print(f"\n  >>> {hhmmss(time.time())}  row welcome-once added: clocked, one-off, at "
              f"{hhmmss(self.clocked_ms / 1000)} <<<\n", flush=True)

    def edit(self) -> None:
        from celery.schedules import schedule
        from django_celery_beat.models import IntervalSchedule, PeriodicTask
        row = PeriodicTask.objects.get(name="billing-every-5s")
        row.interval = IntervalSchedule.objects.get_or_create(every=10, period="seconds")[0]
        edited = time.time()
        row.save(update_fields=["interval"])     # the run counts are the beats' to write
        print(f"\n  >>> {hhmmss(edited)}  row billing-every-5s edited: every 10 s now <<<\n",
              flush=True)
        read = self.all_read_again()
        old = self.phases["billing-every-5s"][0]
        self.phases["billing-every-5s"] = [(old[0], edited - JITTER_S, old[2]),
                                           (read, float("inf"), schedule(10))]

    def disable(self) -> None:
        from django_celery_beat.models import PeriodicTask
        row = PeriodicTask.objects.get(name="report-every-3s")
        row.enabled = False
        disabled = time.time()
        row.save(update_fields=["enabled"])
        print(f"\n  >>> {hhmmss(disabled)}  row report-every-3s disabled <<<\n", flush=True)
        read = self.all_read_again()
        old = self.phases["report-every-3s"][0]
        self.phases["report-every-3s"] = [(old[0], disabled - JITTER_S, old[2])]
        self.silent_after["report-every-3s"] = read

    def run(self) -> int:
        app = self.setup_django()
        self.create_rows()
        print(f"Django project djproj: database {RUN}/db.sqlite3 migrated, 4 PeriodicTask rows "
              f"created\nstarting a worker and three beat instances ({', '.join(BEATS)}) ...",
              flush=True)
        try:
            self.celery.worker("worker", pool="threads", concurrency=4)
            for name in BEATS:
                self.celery.beat(name)
            self.wait_ready("worker", "ready.")
            ready = [max(self.wait_ready(name, "anarchon: instance"), self.wait_ready(name, READ))
                     for name in BEATS]
            # a store that has just been created refuses runs of its first 10 s: it cannot tell
            # a new store from one that lost its data (docs/design.md "Amnesia")
            start = min(ready) + 11
            end = start + SECONDS
            self.window = (start, end)
            print(f"all running. A new store refuses its first 10 s of runs; counting runs from "
                  f"{hhmmss(start)} for {SECONDS:.0f} s.\n", flush=True)
            self.wait(start)
            self.add_clocked(start + SECONDS / 4)
            self.wait(start + SECONDS / 3)
            self.edit()
            self.wait(start + SECONDS * 0.6)
            self.disable()
            self.wait(end)
            for name in BEATS:
                self.celery.stop(name)
            sent = sum(self.celery.text(b).count("Sending due task") for b in BEATS)
            deadline = time.time() + SLACK_S       # the worker executes what the broker holds
            while len(self.executions()) < sent and time.time() < deadline:
                self.wait(time.time() + 0.5)
        finally:
            self.celery.stop_all()
        self.show_new()
        return self.verdict(app, start, end, sent)

    def verdict(self, app, start: float, end: float, sent: int) -> int:
        from django_celery_beat.models import PeriodicTask

        from celery_anarchon.schedule.slots import slots_for
        runs = collections.Counter((r["entry"], r["slot"]) for r in self.executions())
        by_row = collections.Counter(r["entry"] for r in self.executions())
        expected = once = 0
        problems = []
        print(f"\n{'row':<24}{'expected':>9}{'once':>6}{'twice+':>8}{'missed':>8}{'other':>7}"
              f"{'sent':>6}{'total_run_count':>17}")
        for name in [*self.phases, "welcome-once"]:
            want = [self.clocked_ms] if name == "welcome-once" else []
            for lo, hi, sched in self.phases.get(name, []):
                slots = slots_for(sched, entry=name, app_timezone=app.timezone)
                s = slots.next_after(int(max(lo, start) * 1000) - 1)
                while s <= min(hi, end) * 1000:
                    want.append(s)
                    s = slots.next_after(s)
            row_once = sum(1 for s in want if runs[(name, s)] == 1)
            twice = sorted(s for (e, s), n in runs.items() if e == name and n > 1)
            missed = [s for s in want if runs[(name, s)] == 0]
            silent_s = self.silent_after.get(name, float("inf"))
            late = [s for (e, s) in runs if e == name and s > silent_s * 1000]
            row = PeriodicTask.objects.get(name=name)
            other = sum(1 for (e, s) in runs if e == name and s not in set(want))
            print(f"{name:<24}{len(want):>9}{row_once:>6}{len(twice):>8}{len(missed):>8}"
                  f"{other:>7}{by_row[name]:>6}{row.total_run_count:>17}")
            expected, once = expected + len(want), once + row_once
            problems += [f"{name} {hhmmss(s / 1000)} ran {runs[(name, s)]} times" for s in twice]
            problems += self.explain(name, missed)
            problems += [f"{name} {hhmmss(s / 1000)} ran after every beat read it disabled"
                         for s in late]
            if row.total_run_count != by_row[name]:
                problems.append(f"{name}: total_run_count {row.total_run_count}, but "
                                f"{by_row[name]} runs were sent")
        welcome = PeriodicTask.objects.get(name="welcome-once")
        if welcome.enabled:
            problems.append("welcome-once is still enabled after its one run")
        executed = len(self.executions())
        if executed != sent:
            problems.append(f"the beats logged {sent} sends, the worker executed {executed}")
        print(f"\nruns expected: {expected}   sent exactly once: {once}   sends logged by the "
              f"beats: {sent}   executed: {executed}")
        print("other: runs outside the counted window (the beats stop a moment after it), or of a"
              " slot within a jitter and a sync interval of an edit, sent by a beat that had not "
              "read it yet (a disable is a pause held in the claim: docs/from-django-celery-beat"
              ".md, \"The admin\")"
              "; none was sent twice")
        for line in problems:
            print(f"  PROBLEM: {line}")
        print("verdict: " + ("each run exactly once, the one-off once, every total_run_count "
                             "equal to the runs sent" if not problems else
                             f"{len(problems)} problems"))
        return 1 if problems else 0

    def explain(self, name: str, missed: list[int]) -> list[str]:
        """Print the store's reason for each missed slot of ``name``; the slots with none."""
        from celery_anarchon.settings import Settings
        from celery_anarchon.stores import open_store
        from djproj.celery import app
        if not missed:
            return []
        settings = Settings.from_app(app)
        store = open_store(settings.store_url, namespace=settings.namespace, instance_id="demo",
                           options=settings.store_options)
        try:
            history = {h.slot_ms: h for h in store.history.read(name, limit=1000)}
        finally:
            store.close()
        unexplained = []
        for s in missed:
            h = history.get(s)
            if h is None:
                unexplained.append(f"{name} {hhmmss(s / 1000)} missed with NO recorded reason")
            else:
                print(f"  missed {name} {hhmmss(s / 1000)}: the store's history says "
                      f"{h.event.value!r} by {self.names.get(h.instance, h.instance)}")
        return unexplained


if __name__ == "__main__":
    sys.exit(DjangoDemo().run())
