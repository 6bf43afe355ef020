"""What an instance keeps when its store lost entries data (docs/design.md "Amnesia").

A store can lose what it held of the entries: a Redis restarted without persistence, dropped
tables, an older copy put back (a restored backup, a promoted replica that missed writes). The
instance notices it at its sync: the store's entries epoch vanished or changed, or its entries
version went back (:func:`loss_of`). It then keeps what it last knew: for each name, the record
it knew stands over the store's unless the store holds a record of that name written at or after
it (an operator wrote the name again: a pause, a resume, an add, a removal) or an operator
accepted the loss after it was written (``store.entries.accept_loss``). Times are the store's clock
(``StoredEntry.updated_ms``). So a paused entry stays paused (:meth:`KeptEntries.pause_detail`:
the engine never claims its runs), a store entry keeps running, and a store entry removed before
the loss stays removed when an older copy brings it back (withheld). A restart of the beat
forgets what it kept: it starts from the store, as an instance started after the loss does.

The loss is an ERROR in the log once per change (what is kept and the fix), each store entry kept
a WARNING with the command that writes it again, each name the store holds again an INFO line;
the instance record carries a summary (:meth:`KeptEntries.record`, for ``status`` and the page),
and the observer the counts (metrics).
"""
from __future__ import annotations

import dataclasses
import logging
import shlex
from collections.abc import Mapping
from typing import Callable

from celery_anarchon._util import iso, log_time
from celery_anarchon.beat.engine.observe import NOOP, Observer
from celery_anarchon.stores.entry_store import EntrySnapshot, Pause, StoredEntry

logger = logging.getLogger(__name__)

#: names listed per kind in a log line and in the instance record, at most
LISTED = 100
#: names listed per kind in the ERROR line, at most
IN_LINE = 20


def loss_of(before: tuple[str, int] | None, now: tuple[str, int]) -> str | None:
    """Why the store lost entries data between two reads of ``(entries epoch, version)``, or
    ``None``: the epoch vanished or changed, or the version went back. ``before`` is ``None``
    before this instance's first sync (nothing known, nothing lost); an epoch written where there
    was none (the first write, or a store written by an older version) is no loss."""
    if before is None:
        return None
    (epoch_was, version_was), (epoch, version) = before, now
    if epoch_was and not epoch:
        return (f"its entries epoch {epoch_was} is gone (a Redis restarted without its data, "
                "dropped tables, a new database)")
    if epoch_was and epoch != epoch_was:
        return (f"its entries epoch changed from {epoch_was} to {epoch} (a restart, a failover "
                "or a replaced database: the newest writes may be lost)")
    if version < version_was:
        return (f"its entries version went back from {version_was} to {version} (an older copy: "
                "a restored backup, a replica that missed writes)")
    return None


def resolve(known: Mapping[str, StoredEntry], stored: Mapping[str, StoredEntry],
            accepted_ms: int) -> dict[str, StoredEntry]:
    """The records to follow after a loss: the store's, except where the record this instance
    knew is newer than the store's record of that name (or the store has none) and no loss was
    accepted after it was written (module docstring)."""
    out = dict(stored)
    for name, mine in known.items():
        theirs = stored.get(name)
        if theirs is not None and theirs.updated_ms >= mine.updated_ms:
            continue
        if accepted_ms > mine.updated_ms:
            continue
        out[name] = mine
    return out


@dataclasses.dataclass
class _State:
    """The kept names by kind: pauses the store lost, store entries it lost (or holds an older
    definition of) that keep running, and store entries it brought back that stay removed."""

    pauses: dict[str, Pause] = dataclasses.field(default_factory=dict)
    entries: dict[str, StoredEntry] = dataclasses.field(default_factory=dict)
    withheld: dict[str, StoredEntry] = dataclasses.field(default_factory=dict)

    def names(self) -> set[str]:
        return set(self.pauses) | set(self.entries) | set(self.withheld)


class KeptEntries:
    """The records this instance follows, and what of them it keeps over the store's.

    :param instance_id: this instance's id (in the details of paused runs).
    :param where: how the log names the store (``"redis://... (namespace 'x')"``).
    :param clock: the wall clock, epoch seconds (when the loss was seen).
    :param observer: told how many pauses and store entries are kept, and of each loss.
    """

    def __init__(self, instance_id: str, where: str, clock: Callable[[], float], *,
                 observer: Observer = NOOP) -> None:
        self.instance_id = instance_id
        self.where = where
        self.clock = clock
        self.observer = observer
        self.known: dict[str, StoredEntry] = {}     #: the records followed at the last sync
        self.state = _State()
        self.why = ""                   #: why the store lost data (the last loss seen)
        self.since_ms: int | None = None  #: when this instance saw it (its clock, UTC ms)
        self.requests = 0               #: run-now runs handled here that the store lost

    def __bool__(self) -> bool:
        """Whether something is kept over the store's records."""
        return bool(self.state.names())

    @property
    def pauses(self) -> dict[str, Pause]:
        """The pauses kept: name -> the pause as this instance knew it."""
        return self.state.pauses

    def pause_detail(self, name: str) -> str | None:
        """The history detail of a run of ``name`` refused here because its pause is kept, or
        ``None`` when no pause of it is kept."""
        pause = self.state.pauses.get(name)
        if pause is None:
            return None
        return (f"{pause.describe()}; the pause is kept by {self.instance_id} from before the "
                f"store lost it (seen at {iso(self.since_ms or 0)})")

    def follow(self, snapshot: EntrySnapshot, loss: str | None) -> EntrySnapshot:
        """The snapshot to run: the store's, or, after a loss and while something is kept, the
        store's with the records this instance keeps (:func:`resolve`). Logs and counts what
        changed (module docstring).

        :param loss: why the store lost data since the last sync (:func:`loss_of`), or ``None``.
        """
        if loss is None and not self:
            self.known = dict(snapshot.entries)
            return snapshot
        if loss is not None:
            self.why, self.since_ms = loss, int(self.clock() * 1000)
            self.observer.entries_lost()
        entries = resolve(self.known, snapshot.entries, snapshot.accepted_ms)
        old, new, known = self.state, _kept(entries, snapshot.entries), self.known
        self.state, self.known = new, entries
        self._log(old, new, known, snapshot, loss)
        self.observer.entries_kept(len(new.pauses), len(new.entries) + len(new.withheld))
        if not self:
            return dataclasses.replace(snapshot, entries=dict(snapshot.entries))
        return dataclasses.replace(snapshot, entries=entries)

    def record(self) -> dict | None:
        """The summary in this instance's record (``InstanceRecord.kept``), ``None`` when nothing
        is kept."""
        if not self:
            return None
        s = self.state
        return {"since": self.since_ms, "why": self.why,
                "pauses": {n: s.pauses[n].describe() for n in sorted(s.pauses)[:LISTED]},
                "entries": sorted(s.entries)[:LISTED], "withheld": sorted(s.withheld)[:LISTED],
                "counts": {"pauses": len(s.pauses), "entries": len(s.entries),
                           "withheld": len(s.withheld)},
                "requests": self.requests}

    # -- the log -------------------------------------------------------------------------------
    def _log(self, old: _State, new: _State, known: Mapping[str, StoredEntry],
             snapshot: EntrySnapshot, loss: str | None) -> None:
        added = new.names() - old.names()
        if loss is not None and not added:
            logger.info("anarchon: the store %s: %s; nothing more is kept from before it (the "
                        "store holds every entry and pause this instance knew%s, or an operator "
                        "accepted the loss)", self.where, loss,
                        ", besides what was kept already" if self else "")
        if added:
            logger.error("anarchon: store entries lost: the store %s lost entries or pauses this "
                         "instance knew: %s. %s", self.where, self.why, self._kept_text(new))
            for name in sorted(set(new.entries) & added)[:LISTED]:
                stored = new.entries[name]
                logger.warning("anarchon: store entry %s keeps running here from before the "
                               "store's loss; to write it again: celery anarchon add %s "
                               "--json-definition %s", name, shlex.quote(name),
                               shlex.quote(stored.definition or ""))
        for name in sorted(old.names() - new.names()):
            theirs, mine = snapshot.entries.get(name), known.get(name)
            if theirs is not None and (mine is None or theirs.updated_ms >= mine.updated_ms):
                logger.info("anarchon: entry %s: the store holds it again (written by %s at %s): "
                            "following the store", name, theirs.updated_by,
                            log_time(theirs.updated_ms))
            else:
                logger.info("anarchon: entry %s: the loss was accepted by %s at %s: following the "
                            "store", name, snapshot.accepted_by or "an operator",
                            log_time(snapshot.accepted_ms))
        if old.names() and not new.names():
            logger.warning("anarchon: nothing is kept from before the store's loss any more: "
                           "following the store %s", self.where)

    def _kept_text(self, s: _State) -> str:
        parts = []
        if s.pauses:
            parts.append("pauses (no run of them is claimed here): " + _listed(
                [f"{n} ({s.pauses[n].describe()})" for n in sorted(s.pauses)]))
        if s.entries:
            parts.append("store entries (they keep running): " + _listed(sorted(s.entries)))
        if s.withheld:
            parts.append("store entries removed before the loss that the store brought back "
                         "(not run): " + _listed(sorted(s.withheld)))
        if self.requests:
            parts.append(f"{self.requests} run-now run(s) handled here (never claimed again)")
        fixes = [f"celery anarchon pause {shlex.quote(n)} --reason "
                 f"{shlex.quote(s.pauses[n].reason)}" for n in sorted(s.pauses)[:3]]
        if s.entries:
            fixes.append("celery anarchon add NAME ... (each is logged with its definition)")
        return ("Kept here until the store holds them again or an operator accepts the loss: "
                + "; ".join(parts) + ". A restart of this beat forgets what it keeps, and an "
                "instance started since runs what the store holds. Fix: write them again ("
                + "; ".join(fixes or ["celery anarchon remove NAME"]) + "), or accept the "
                "loss: celery anarchon accept-loss (every instance then follows the store as "
                "it is). celery anarchon status shows what each instance keeps.")


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:IN_LINE])
    return shown + (f" and {len(names) - IN_LINE} more" if len(names) > IN_LINE else "")


def _kept(followed: Mapping[str, StoredEntry], stored: Mapping[str, StoredEntry]) -> _State:
    """What the followed records keep over the store's."""
    state = _State()
    for name, mine in followed.items():
        theirs = stored.get(name)
        if mine.pause is not None and (theirs is None or theirs.pause is None):
            state.pauses[name] = mine.pause
        definition = theirs.definition if theirs is not None else None
        if mine.definition != definition:
            if mine.definition is not None:
                state.entries[name] = mine
            else:
                state.withheld[name] = mine
    return state
