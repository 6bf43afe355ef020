"""The task message of one run of an entry: what beat publishes for a won claim and what a
backfill publishes for a slot it won (docs/design.md "One run, in time", point 4): the entry's
task, args and kwargs, its ``apply_async`` options without our ``anarchon`` key, the headers of
:mod:`celery_anarchon.messages` and the task id of :func:`~celery_anarchon.schedule.plan.task_id_for`.

One function builds it for both senders, so a backfilled run reaches a worker exactly as a
scheduled one does (a leased entry's attempt and fencing token included).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from celery import beat

from celery_anarchon.messages import (
    HEADER_ATTEMPT, HEADER_ENTRY, HEADER_INSTANCE, HEADER_LEASE, HEADER_NAMESPACE, HEADER_SLOT,
    HEADER_TOKEN,
)


@dataclasses.dataclass(frozen=True)
class TaskMessage:
    """What to hand to ``Task.apply_async(args, kwargs, **options)`` (or ``app.send_task(task,
    args, kwargs, **options)`` for a task this process does not register).

    :param task: the task's registered name.
    :param args: the positional arguments, Celery's lazy values (``BeatLazyFunc``) evaluated.
    :param kwargs: the keyword arguments, evaluated as ``args``.
    :param options: the entry's ``apply_async`` options with ``headers``, ``task_id`` and
        ``retry=False`` (a publish that broke off may have reached the broker: never repeated).
    """

    task: str
    args: Any
    kwargs: Any
    options: dict


def task_message(plan, *, namespace: str, instance_id: str, slot_ms: int, attempt: int,
                 token: int | None, task_id: str) -> TaskMessage:
    """The message of one attempt of one run of ``plan``'s entry
    (:class:`~celery_anarchon.schedule.plan.EntryPlan`), sent by ``instance_id``.

    :param namespace: ``anarchon_namespace``, in the headers.
    :param slot_ms: the run's slot, UTC ms.
    :param attempt: 1 for the first send, 2... for a takeover of a leased run.
    :param token: the attempt's fencing token (leased entries; ``None`` otherwise).
    :param task_id: the attempt's task id (:func:`~celery_anarchon.schedule.plan.task_id_for`).
    """
    entry = plan.entry
    options = copy.deepcopy(plan.celery_options)
    headers = dict(options.pop("headers", None) or {})
    headers.update({
        "celery_beat_task": True,
        HEADER_NAMESPACE: namespace,
        HEADER_ENTRY: plan.name,
        HEADER_SLOT: int(slot_ms),
        HEADER_INSTANCE: instance_id,
        HEADER_ATTEMPT: int(attempt),
    })
    lease = plan.timing.lease
    if lease is not None:
        headers[HEADER_TOKEN] = int(token)
        headers[HEADER_LEASE] = {"duration": lease.duration_s, "heartbeat": lease.heartbeat_s,
                                 "queue_timeout": lease.queue_timeout_s}
    options.update(headers=headers, task_id=task_id, retry=False)
    options.pop("retry_policy", None)
    return TaskMessage(entry.task, beat._evaluate_entry_args(entry.args),
                       beat._evaluate_entry_kwargs(entry.kwargs), options)
