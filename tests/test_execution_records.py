"""The execution records the multi-process tests read while workers write them
(benchmarks/procs.py): a line another process is still writing is not read until it is whole."""
from __future__ import annotations

import json

from procs import append_record, read_records


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path):
    path = str(tmp_path / "executions.jsonl")
    append_record(path, {"entry": "e", "slot": 1})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"entry": "dyn", "slot": 2, ')        # the first part of another's write
    assert read_records(path) == [{"entry": "e", "slot": 1}]
    with open(path, "a", encoding="utf-8") as f:
        f.write('"task_id": "t"}\n')
    assert read_records(path)[-1] == json.loads('{"entry": "dyn", "slot": 2, "task_id": "t"}')
