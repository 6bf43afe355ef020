"""What the tests on servers of their own (tests/test_ha_*.py, rigs of benchmarks/ha_*.py) share:
the rule for a missing server binary, the rig of a test or a module, stores opened for a test
and closed after it, and a call retried while the store elects a leader or fails over.

    from ha_support import opened_stores, rig_fixture
    opened = opened_stores()          # opened(url, namespace, instance_id, **options)
    rig = rig_fixture(lambda: ha_nats.NatsCluster(3), scope="module", needs=need_nats)
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from celery_anarchon.errors import StoreUnavailable
from celery_anarchon.stores import open_store
from celery_anarchon.stores._common import retrying
from celery_anarchon.stores.base import ClaimStore

from conftest import IN_CI

T = TypeVar("T")


def need(available: bool, missing: str) -> None:
    """Skip the calling test when ``available`` is false, or fail it under CI (``CI=true``): a CI
    that lacks a server binary fails rather than skips, as with a shared server."""
    if not available:
        if IN_CI:
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)


def rig_fixture(make: Callable[[], contextlib.AbstractContextManager[T]], *,
                scope: str = "function", needs: Callable[[], None] | None = None):
    """A pytest fixture that yields the rig ``make()`` opens (a context manager: its servers are
    stopped when the fixture ends), after ``needs()`` (e.g. :func:`need` of its binary).

    :param scope: the fixture's scope (``"module"``: one rig for the module's tests).
    """
    @pytest.fixture(scope=scope)
    def fixture() -> Iterator[T]:
        if needs is not None:
            needs()
        with make() as rig:
            yield rig
    return fixture


def opened_stores():
    """A pytest fixture that yields ``open(url, namespace, instance_id, **options)``: a store
    opened with those options (``open_store``), closed when the test ends."""
    @pytest.fixture
    def fixture() -> Iterator[Callable[..., ClaimStore]]:
        stores: list[ClaimStore] = []

        def open_one(url: str, namespace: str, instance_id: str, **options: Any) -> ClaimStore:
            store = open_store(url, namespace=namespace, instance_id=instance_id, options=options)
            stores.append(store)
            return store
        yield open_one
        for store in stores:
            store.close()
    return fixture


def until_answered(call: Callable[[], T], within_s: float) -> T:
    """``call()``, retried on StoreUnavailable (a leader election, a failover: as beat retries)
    for ``within_s`` seconds; the last StoreUnavailable is raised after that."""
    return retrying((StoreUnavailable,), deadline_s=within_s, wait_s=0.1, max_wait_s=0.1)(call)


def assert_release_lost_is_never_taken_over(store, entry: str, slot_ms: int, run):
    """After a failover that lost the release of ``run`` (adopted, released on the old primary or
    master only): ``store`` finds the run expired and still started under its token, refuses to
    take it over (GIVEN_UP: the store may have lost writes to it), and records why. Returns the
    history note, for the epoch its detail must name.

    :param run: the LeasedRun the worker adopted (its token).
    """
    from celery_anarchon.stores.base import RunEvent, RunState, TakeoverOutcome
    from stores_support import wait_until
    expired = wait_until(lambda: store.leases.expired_runs([entry]), 10, "the stale lease to run out")[0]
    assert expired.state is RunState.STARTED and expired.token == run.token, "release lost"
    outcome, record = store.leases.take_over(entry, slot_ms, run.token, queue_timeout_ms=60_000,
                                      max_attempts=3)
    assert outcome is TakeoverOutcome.GIVEN_UP, (outcome, record)
    assert store.leases.inspect(entry, slot_ms).state is RunState.GIVEN_UP
    assert not store.leases.expired_runs([entry])
    note = store.history.read(entry)[0]
    assert note.event is RunEvent.GIVEN_UP and "not taken over" in note.detail, note
    return note
