"""The live beat instances of a namespace as the status data shows them (:func:`overview
<celery_anarchon.operate.overview.overview>`): their records, what they keep from before the
store lost entries data (docs/design.md "Amnesia"), and where their definitions disagree.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from celery_anarchon._util import iso
from celery_anarchon.errors import ConfigError
from celery_anarchon.operate.listing import CONFIG, STORE
from celery_anarchon.schedule import definition as entry_json
from celery_anarchon.schedule.plan import build_plan, clash_fix
from celery_anarchon.settings import Settings
from celery_anarchon.stores.base import ClaimStore
from celery_anarchon.stores.entry_store import InstanceRecord, refused_of

#: an instance whose last tick is older than this many sync intervals (store clock) is stale
STALE_INTERVALS = 2


def maybe_iso(ms: int | None) -> str | None:
    """UTC ms as ISO 8601 (:func:`~celery_anarchon._util.iso`), ``None`` as ``None``."""
    return None if ms is None else iso(ms)


def instance_json(r: InstanceRecord, store_now_ms: int | None, sync_interval_s: float) -> dict:
    """One instance record with ``ticking`` / ``stale``: its last tick, moved onto the store's
    clock with its skew, older than :data:`STALE_INTERVALS` sync intervals."""
    last_on_store = r.last_tick_ms - (r.skew_ms or 0)
    age_ms = None if store_now_ms is None else max(0, store_now_ms - last_on_store)
    stale = age_ms is not None and age_ms > STALE_INTERVALS * sync_interval_s * 1000
    return {"instance_id": r.instance_id, "host": r.host, "pid": r.pid, "version": r.version,
            "started": iso(r.started_ms), "last_tick": iso(r.last_tick_ms),
            "last_tick_age_s": None if age_ms is None else round(age_ms / 1000, 3),
            "skew_ms": r.skew_ms, "entries": r.entries,
            "fingerprints_digest": r.fingerprints_digest, "seen": maybe_iso(r.seen_ms or None),
            "expires": maybe_iso(r.expires_ms or None),
            "ticking": not stale, "stale": stale, "kept": r.kept}


#: what an operator does about a loss the instances keep from (status, the page)
LOST_FIX = ("write each kept pause and store entry again (celery anarchon pause NAME --reason "
            "...; celery anarchon add NAME ..., the beat's log gives each store entry's "
            "definition), or accept the loss: celery anarchon accept-loss (every instance then "
            "follows the store as it is)")


def lost_json(records: list[InstanceRecord]) -> list[dict]:
    """What live instances keep from before the store lost entries data (docs/design.md
    "Amnesia"), one item per instance that keeps something."""
    out = []
    for r in records:
        k = r.kept or {}
        if not k:
            continue
        out.append({"instance": _who(r), "instance_id": r.instance_id,
                    "since": maybe_iso(k.get("since")), "why": k.get("why", ""),
                    "pauses": dict(k.get("pauses") or {}), "entries": list(k.get("entries") or []),
                    "withheld": list(k.get("withheld") or []),
                    "counts": dict(k.get("counts") or {}),
                    "requests": k.get("requests", 0)})
    return out


def lost_lines(data: dict) -> list[str]:
    """The ``lost`` part of the status data as text lines (``status``), empty when nothing is
    kept."""
    lines = []
    for item in data.get("lost") or ():
        lines.append(f"  {item['instance']} since {item['since']}: {item['why']}")
        for name, pause in item["pauses"].items():
            lines.append(f"    pause kept (no run claimed there): {name} ({pause})")
        if item["entries"]:
            lines.append(f"    store entries kept running: {', '.join(item['entries'])}")
        if item["withheld"]:
            lines.append("    store entries removed before the loss, brought back by the store, "
                         f"not run there: {', '.join(item['withheld'])}")
        if item["requests"]:
            lines.append(f"    {item['requests']} run-now run(s) handled there, never claimed again")
    if lines:
        lines.insert(0, "ERROR: the store lost entries data; these instances keep what they knew:")
        lines.append(f"  fix: {LOST_FIX}")
    return lines


def refused_json(records: list[InstanceRecord]) -> list[dict]:
    """The entries live instances leave out because our rules refuse them (a django-celery-beat
    row that breaks a rule: :class:`celery_anarchon.contrib.django_celery_beat.Scheduler` runs the
    others), each ``{entry, error, instances}``: the error (naming the entry, where it comes from
    and the fix) and the instances (``host:pid``) that gave it, by entry name; one entry is
    listed once per distinct error (instances that read the row at different times)."""
    by: dict[tuple[str, str], list[str]] = {}
    for r in records:
        for name, error in (refused_of(r.refused) or {}).items():
            by.setdefault((name, error), []).append(_who(r))
    return [{"entry": name, "error": error, "instances": who}
            for (name, error), who in sorted(by.items())]


def refused_lines(data: dict) -> list[str]:
    """The ``refused`` part of the status data as text lines (``status``), empty when no
    instance leaves an entry out."""
    refused = data.get("refused") or ()
    if not refused:
        return []
    lines = [f"entries left out by beat, not run (our rules refuse them; the others run): "
             f"{len({r['entry'] for r in refused})}"]
    for r in refused:
        lines.append(f"  {r['entry']}: {r['error']} (on {', '.join(r['instances'])})")
    return lines


def _who(r: InstanceRecord) -> str:
    return f"{r.host}:{r.pid}"


#: where a live instance takes an entry's definition from (``disagreements[].definitions[].source``)
SOURCE_CONFIG, SOURCE_STORE = CONFIG, STORE


def fingerprint_views(store: ClaimStore, records: list[InstanceRecord], stored: Mapping[str, str],
                       store_definition: Callable[[str], tuple[str | None, str]]
                       ) -> tuple[list[dict], list[dict], list[str]]:
    """The config entries only some instances run, the entries whose fingerprints differ
    between instances, and the instances whose fingerprints are not saved yet.

    An instance whose beat_schedule lacks a name that is a store entry (``stored``: name ->
    definition text) runs the store's (:meth:`EntrySync.merge`): it is not "not running" the
    entry, and when others run a beat_schedule entry of that name, the entry is a disagreement
    whose definitions say where each comes from (``store_definition``: a store entry's
    fingerprint and definition as beat builds them)."""
    mappings: dict[str, dict[str, str] | None] = {}
    for r in records:
        if r.fingerprints_digest not in mappings:
            mappings[r.fingerprints_digest] = store.instances.load_fingerprints(
                r.fingerprints_digest)
    known = [(r, m) for r in records if (m := mappings[r.fingerprints_digest]) is not None]
    unsaved = [_who(r) for r in records if mappings[r.fingerprints_digest] is None]
    names = sorted({n for _, m in known for n in m})
    partial = []
    disagreements = []
    for name in names:
        without = [_who(r) for r, m in known if name not in m]
        if without and name not in stored:
            partial.append({"entry": name, "run_by": [_who(r) for r, m in known if name in m],
                            "not_run_by": without})
        groups: dict[tuple[str, str | None], list[str]] = {}
        for r, m in known:
            if name in m:
                groups.setdefault((SOURCE_CONFIG, m[name]), []).append(_who(r))
        store_text: dict[tuple[str, str | None], str] = {}
        if without and name in stored:     # they run the store entry of that name
            fingerprint, store_text[(SOURCE_STORE, fingerprint)] = store_definition(name)
            groups[(SOURCE_STORE, fingerprint)] = without
        if len(groups) > 1:
            disagreements.append({"entry": name, "definitions": [
                {"fingerprint": fp, "source": source, "instances": hosts,
                 "definition": (store_text[(source, fp)] if source == SOURCE_STORE
                                else store.history.load_definition(name, fp))}
                for (source, fp), hosts in sorted(groups.items(), key=lambda g: (g[0][0],
                                                                                g[0][1] or ""))],
                "fix": clash_fix(name) if store_text else None})
    return partial, disagreements, unsaved


def store_definition(app, settings: Settings, store: ClaimStore, name: str,
                      text: str) -> tuple[str | None, str]:
    """A store entry's fingerprint and definition as a beat builds them; ``None`` and its JSON
    text with the rule it breaks when beat refuses it."""
    try:
        plan = build_plan(name, entry_json.parse(name, text, app=app), app=app,
                          settings=settings, store=store)
    except ConfigError as exc:
        return None, f"{text} (beat refuses it: {exc})"
    return plan.fingerprint, plan.definition

