"""The times the commands print, as an operator reads them: relative to now and in the entry's
zone by default, ISO 8601 UTC with ``--utc`` (``list``, ``next``; ``status`` in
test_cli_quiet.py), ``list`` within 120 columns with realistic names (``--wide``: whole cells),
and the exit code of a probe on a store that cannot be reached (tests/support/apps/
operate_app.py, real subprocesses)."""
from __future__ import annotations

import re

from operate_support import exits, operate

#: ISO 8601 UTC with milliseconds, as --json and --utc give an instant
ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"
#: realistic names: a store entry's, and its task's (not registered here: --no-check-task)
LONG_NAME = "billing.invoices.generate-monthly-statements-for-enterprise-customers"
LONG_TASK = "operate_app.billing.invoices.tasks.generate_monthly_statements"


def _rows(out: str) -> dict[str, str]:
    """A table's rows by their first cell (its heading under ``NAME``)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("NAME "))
    return {line.split()[0]: line for line in lines[start:] if line.strip()}


def test_list_shows_the_next_slot_relative_and_in_the_entrys_zone_and_utc_with_utc(
        tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    exits(operate(url, namespace, "good", "pause", "berlin-0230", "--reason", "migration",
                  "--by", "ops"), 0)
    rows = _rows(exits(operate(url, namespace, "good", "list"), 0))
    assert rows["NAME"].split() == ["NAME", "SOURCE", "SCHEDULE", "TASK", "NEXT", "STATE"], rows
    # a cron entry of Europe/Berlin: 02:30 there (CET or CEST), how far off first; the next
    # slot whole, the other cells cut to fit 120 columns
    assert re.search(r"  in \d+ (s|min|h) \(\d{4}-\d\d-\d\dT0[23]:\d0:00\+0[12]:00\) +paused by ",
                     rows["berlin-0230"]), rows
    wide = _rows(exits(operate(url, namespace, "good", "list", "--wide"), 0))
    assert re.search(r"  in \d+ (s|min|h) \(\d{4}-\d\d-\d\dT0[23]:\d0:00\+0[12]:00\) +paused by "
                     r"ops: migration \(since \d+ s ago\)$", wide["berlin-0230"]), wide
    # an interval entry, in the app's zone (UTC)
    assert re.search(r"  in [0-3] s \(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\) +running$",
                     rows["every-2s"]), rows
    utc = _rows(exits(operate(url, namespace, "good", "list", "--utc", "--wide"), 0))
    assert re.search(rf"  {ISO_UTC}  paused by ops: migration \(since {ISO_UTC}\)$",
                     utc["berlin-0230"]), utc
    assert re.search(r"  \d{4}-\d\d-\d\dT0[01]:\d0:00\.000\+00:00  ", utc["berlin-0230"]), utc
    assert " ago" not in "\n".join(utc.values()) and " in " not in "\n".join(utc.values())


def test_list_fits_120_columns_with_realistic_names_and_wide_prints_whole_cells(
        tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    exits(operate(url, namespace, "good", "add", LONG_NAME, "--task", LONG_TASK, "--cron",
                  "30 2 1 * *", "--timezone", "America/New_York", "--no-check-task"), 0)
    exits(operate(url, namespace, "good", "pause", LONG_NAME, "--by", "ops@web-1.internal:4242",
                  "--reason", "the invoicing database is being migrated to the new cluster"), 0)
    for args in ((), ("--utc",)):
        out = exits(operate(url, namespace, "good", "list", *args), 0)
        assert max(len(line) for line in out.splitlines()) <= 120, out
        [row] = [line for line in out.splitlines() if line.startswith(LONG_NAME[:10])]
        assert "…" in row and re.split(r" {2,}", row)[-1].startswith("paused by "), out
    wide = exits(operate(url, namespace, "good", "list", "--wide"), 0)
    [row] = [line for line in wide.splitlines() if line.startswith(LONG_NAME)]
    assert LONG_TASK in row and "cron 30 2 1 * * America/New_York" in row, wide
    assert row.endswith("migrated to the new cluster (since " + row.rsplit("(since ", 1)[1]), row
    assert "…" not in wide and len(row) > 120, wide


def test_next_utc_prints_the_slots_in_utc_only_and_a_pause_since_in_iso(tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    after = ("--after", "2027-03-26T12:00:00Z")
    out = exits(operate(url, namespace, "good", "next", "berlin-0230", "-n", "2", *after), 0)
    assert "in UTC and in Europe/Berlin:" in out and "2027-03-27 02:30:00 CET" in out, out
    exits(operate(url, namespace, "good", "pause", "berlin-0230", "--by", "ops"), 0)
    out = exits(operate(url, namespace, "good", "next", "berlin-0230", "-n", "2", *after), 0)
    assert re.search(r"^berlin-0230 is paused by ops since \d+ s ago; ", out, re.M), out
    utc = exits(operate(url, namespace, "good", "next", "berlin-0230", "-n", "2", "--utc",
                        *after), 0).splitlines()
    assert re.match(rf"berlin-0230 is paused by ops since {ISO_UTC}; ", utc[0]), utc
    assert utc[1:] == ["next 2 slots of berlin-0230 (cron 30 2 * * * Europe/Berlin), in UTC:",
                       "UTC", "2027-03-27T01:30:00+00:00", "2027-03-28T01:00:00+00:00"], utc


def test_status_fail_if_no_instance_exits_1_not_7_when_the_store_cannot_be_reached(namespace):
    """Exit 7 says no beat runs; a store that cannot be read says nothing of that: exit 1."""
    done = operate("redis://127.0.0.1:1/0", namespace, "good", "status", "--runs", "0",
                   "--fail-if-no-instance")
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "store unreachable: " in done.stdout and "exit 7" not in done.stderr, done
    assert "pauses: unknown (the store cannot be read)" in done.stdout, done.stdout


def test_run_now_says_when_relative_and_the_slot_in_the_entrys_zone_and_iso_with_utc(
        tmp_path, namespace):
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    out = exits(operate(url, namespace, "good", "run-now", "berlin-0230", "--request-id", "t-1",
                        "--by", "ops"), 0)
    assert re.match(r"run-now berlin-0230: new request t-1, slot \d+ s ago \(\d{4}-\d\d-\d\dT"
                    r"\d\d:\d\d:\d\d\+0[12]:00\), by ops\n", out), out      # CET or CEST
    again = exits(operate(url, namespace, "good", "run-now", "berlin-0230", "--request-id",
                          "t-1"), 0)
    assert re.match(r"run-now berlin-0230: request t-1 was already requested \d+ s ago by ops: "
                    r"no new run \(its slot \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+0[12]:00\)\n$", again), again
    utc = exits(operate(url, namespace, "good", "run-now", "berlin-0230", "--request-id", "t-1",
                        "--utc"), 0)
    assert re.match(rf"run-now berlin-0230: request t-1 was already requested at {ISO_UTC} by "
                    rf"ops: no new run \(its slot {ISO_UTC}\)\n$", utc), utc
