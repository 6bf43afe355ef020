"""Entries brought from another scheduler into the store: what each will become, then the writes
(``celery anarchon import redbeat``: :mod:`celery_anarchon.operate.import_redbeat` reads and maps,
docs/from-redbeat.md; ``import django-celery-beat``: :mod:`celery_anarchon.operate.import_django`,
docs/from-django-celery-beat.md; this module compares with the store and writes).

An import is idempotent: an entry whose store entry already says the same (the same canonical
definition, paused when it must be) is ``unchanged`` and nothing is written for it, so a second
run writes nothing. It never removes a store entry, never resumes a pause, and never touches a
name ``beat_schedule`` defines (``skipped``: it runs from there). An entry our rules refuse
(:func:`~celery_anarchon.operate.schedules.checked_definition`: the start-up messages) is
``refused`` with its reason and fix; the others are still written.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from celery_anarchon.errors import ConfigError
from celery_anarchon.operate.import_redbeat import FoundEntry
from celery_anarchon.operate.listing import CONFIG, STORE, ScheduledEntry
from celery_anarchon.operate.names import check_name, normal_name
from celery_anarchon.operate.schedules import Schedules, checked_definition
from celery_anarchon.schedule import as_data
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.stores.entry_store import Pause

#: the actions of a row
ADD, UPDATE, UNCHANGED, REFUSED, SKIPPED = "add", "update", "unchanged", "refused", "skipped"
#: the pause reason of an entry RedBeat held disabled
DISABLED_REASON = "came disabled from RedBeat (enabled=False)"
#: the pause reason of ``--paused``
PAUSED_REASON = ("imported from RedBeat paused: resume it once no RedBeat beat runs "
                 "(docs/from-redbeat.md)")


@dataclasses.dataclass(frozen=True)
class ImportRow:
    """What one entry becomes.

    :param name: the entry's name.
    :param task: its task.
    :param schedule: its schedule in words (ours; RedBeat's when refused).
    :param paused: whether the store entry will be paused (``None``: refused or skipped).
    :param action: ``add``, ``update``, ``unchanged``, ``refused`` or ``skipped``.
    :param note: a few words on the row (why skipped, the pause, the interval's phase).
    :param definition: the definition to write (``add`` / ``update``).
    :param write_definition: whether the definition is written (else only a pause).
    :param pause_reason: the pause to write first (``None``: none).
    :param error: why refused, with the fix.
    """

    name: str
    task: str
    schedule: str
    paused: bool | None
    action: str
    note: str = ""
    definition: dict | None = None
    write_definition: bool = False
    pause_reason: str | None = None
    error: str | None = None


def plan(s: Schedules, found: Iterable[FoundEntry], *, paused: bool = False,
         check_task: bool = True, disabled_reason: str = DISABLED_REASON,
         source: str = "RedBeat", explain: Callable[[str], str] = str) -> list[ImportRow]:
    """What each entry of ``found`` becomes in the store of ``s``; nothing is written.

    Entries whose names are equal once normalized to Unicode NFC (the store's form of a name,
    :func:`~celery_anarchon.operate.names.check_name`) are refused together: they would be one
    store entry, written by one and refused at the write of the other, and each later import
    would flip it between their definitions (as beat refuses two such ``beat_schedule`` names,
    :func:`celery_anarchon.schedule.plan.build_plans`).

    :param paused: pause every entry it adds or updates (``--paused``), not only the disabled.
    :param check_task: refuse a task name the app does not register (as ``add``).
    :param disabled_reason: the pause reason of an entry that came disabled (the other
        scheduler's words).
    :param source: the other scheduler, as a refusal names it (``"django-celery-beat"``).
    :param explain: the refusal of our rules as the other scheduler's users read it (a row's
        settings are in its headers: :func:`celery_anarchon.operate.import_django.refusal`).
    :raises StoreError: the store cannot be read.
    """
    found = list(found)
    twins = _same_once_normalized(found, source)
    current = {e.name: e for e in s.list()}
    return [ImportRow(e.name, e.task, e.schedule, None, REFUSED, error=twins[e.name])
            if e.name in twins else _row(s, e, current, paused, check_task, disabled_reason,
                                         explain)
            for e in found]


def _same_once_normalized(found: list[FoundEntry], source: str) -> dict[str, str]:
    """The refusal of each name of ``found`` equal to another once normalized to Unicode NFC,
    by name: it names both (as written, and escaped, since they look alike) and the fix."""
    groups: dict[str, list[str]] = {}
    for e in found:
        names = groups.setdefault(normal_name(e.name), [])
        if e.name not in names:
            names.append(e.name)
    twins = {}
    for names in (g for g in groups.values() if len(g) > 1):
        listed = " and ".join(repr(n) for n in names)
        escaped = " and ".join(ascii(n) for n in names)
        error = (f"entries {listed} of {source} ({escaped}) are the same name once normalized "
                 "(Unicode NFC: the same characters written two ways), which the store keeps as "
                 f"one entry, so none of them is imported; fix: rename one of them in {source}, "
                 "then import again")
        twins.update(dict.fromkeys(names, error))
    return twins


def _row(s: Schedules, found: FoundEntry, current: dict[str, ScheduledEntry], paused: bool,
         check_task: bool, disabled_reason: str, explain: Callable[[str], str]) -> ImportRow:
    if found.refused is not None:
        return ImportRow(found.name, found.task, found.schedule, None, REFUSED, error=found.refused)
    shown = as_data.describe_schedule(found.definition["schedule"])
    try:
        name = check_name(found.name)
        here = current.get(name)
        if here is not None and here.source == CONFIG:
            return ImportRow(name, found.task, shown, None, SKIPPED,
                             "defined in beat_schedule: runs from there")
        definition = _phase(found, here)
        reason = disabled_reason if not found.enabled else PAUSED_REASON if paused else None
        held = here is not None and here.paused
        pause = reason if reason is not None and not held else None
        stored = here is not None and here.source == STORE
        # the update's own check (Schedules.update) of an entry that stays unpaused meanwhile
        before = entry_json.canonical(here.definition, name=name) \
            if stored and here.definition and not held and pause is None else None
        text, _ = checked_definition(s, name, definition, check_task=check_task, before=before)
    except ConfigError as exc:
        return ImportRow(found.name, found.task, shown, None, REFUSED, error=explain(str(exc)))
    same = stored and entry_json.canonical(here.definition, name=name) == text
    action = UNCHANGED if same and pause is None else UPDATE if stored else ADD
    anchor = definition.get("anarchon", {}).get("anchor")
    phase = ("epoch-aligned" if anchor is None else f"phase kept: anchor {anchor} s"
             if found.anchored else "") if "every" in definition["schedule"] else ""
    notes = [f"paused here: {here.pause.describe()}" if held else reason or "", found.note, phase]
    return ImportRow(name, found.task, shown, held or reason is not None, action,
                     "; ".join(n for n in notes if n), definition, not same, pause)


def _phase(found: FoundEntry, here: ScheduledEntry | None) -> dict:
    """``found``'s definition; with the anchor a store entry of the same interval holds already
    when ``found``'s anchor is RedBeat's last run (``--keep-phase``): RedBeat counts each period
    from when its last run really came, so that instant drifts by its lateness, and a second
    import must not move the phase the first one kept."""
    definition = found.definition
    if not found.anchored or here is None or here.source != STORE or not here.definition:
        return definition
    theirs = here.definition.get("anarchon")
    if (here.definition.get("schedule") != definition["schedule"] or not isinstance(theirs, dict)
            or "anchor" not in theirs):
        return definition
    return {**definition, "anarchon": {**definition["anarchon"], "anchor": theirs["anchor"]}}


def apply(s: Schedules, rows: Iterable[ImportRow], *, check_task: bool = True,
          explain: Callable[[str], str] = str) -> list[ImportRow]:
    """Write the rows to add or update: the pause first (so an entry that must be paused never
    runs unpaused, on an instance that syncs in between), then the definition.

    :param explain: as :func:`plan`'s.
    :returns: the rows as written: one the store refused at the write (a rule of an update,
        :meth:`Schedules.update`; an entry added meanwhile) becomes ``refused`` with its error.
    :raises StoreError: the store cannot be reached (what was written before stays written).
    """
    out = []
    for row in rows:
        if row.action not in (ADD, UPDATE):
            out.append(row)
            continue
        try:
            _write(s, row, check_task)
        except ConfigError as exc:
            row = dataclasses.replace(row, action=REFUSED, error=explain(str(exc)))
        out.append(row)
    return out


def _write(s: Schedules, row: ImportRow, check_task: bool) -> None:
    parts = {k: row.definition.get(k) for k in ("task", "schedule", "args", "kwargs", "options")}
    if row.pause_reason is not None:
        if row.action == ADD:           # no entry yet: the pause alone, as of a config entry's
            s.entries.set_pause(row.name, Pause(reason=row.pause_reason, by=s.by, at_ms=0),
                                by=s.by)
        else:
            s.pause(row.name, row.pause_reason)
    if row.action == ADD:
        s.add(row.name, **parts, anarchon=row.definition.get("anarchon"), check_task=check_task)
    elif row.write_definition:
        s.update(row.name, **parts, anarchon=row.definition.get("anarchon") or {},
                 check_task=check_task)
