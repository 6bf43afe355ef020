"""The claim helpers of the store contract (tests/stores/test_store_contract.py) that the other
store tests and the HA tests share: one claim request, the store's clock, a slot due now, the
stores that hold leases and one racer of several processes claiming the same runs."""
from __future__ import annotations

import random
import shutil
import time

import pytest

from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS, ClaimRequest, LeaseTerms, Outcome

from stores_support import LEASE_STORES, StoreMaker, new_tmpdir, store_url, wait_until

#: the max_late of a claim request (:func:`req`), ms
MAX_LATE_MS = 60_000
#: the lease terms of a leased claim in the contract: a minute to be adopted
LEASE = LeaseTerms(queue_timeout_ms=60_000)


def _maker(kind, namespace):
    """A :class:`StoreMaker` of ``kind`` on a temporary directory of its own (a generator for a
    fixture: every store it opened is closed and the directory removed after)."""
    tmp = new_tmpdir()
    maker = StoreMaker(kind, store_url(kind, tmp), namespace)
    yield maker
    maker.close_all()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=LEASE_STORES)
def lease_stores(request, namespace):
    """Stores that hold leases."""
    yield from _maker(request.param, namespace)


def req(entry, slot_ms, *, max_late_ms=MAX_LATE_MS, lease=None, fingerprint="fp1"):
    """The claim of ``entry``'s run at ``slot_ms`` (task id ``task-<entry>-<slot>``)."""
    return ClaimRequest(entry=entry, slot_ms=slot_ms, max_late_ms=max_late_ms,
                        task_id=f"task-{entry}-{slot_ms}", fingerprint=fingerprint, lease=lease)


def store_now(store) -> int:
    """The store's clock, or this host's for a store without one."""
    now = store.now_ms()
    if now is None:
        assert not store.checks_lateness, "a store that checks lateness has a clock"
        return int(time.time() * 1000)
    assert isinstance(now, int)
    return now


def fresh_slot(store) -> int:
    """A slot that is due now on the store's clock."""
    return store_now(store) + 1


def after_memory_restart(store) -> int:
    """The first slot a store can claim again after it forgot everything: its memory began at
    its first operation since, and slots up to the early tolerance after that are refused."""
    begun = store_now(store)
    wait_until(lambda: store_now(store) > begun + 20, 5, "store clock to move")
    return begun + LATENESS_TOLERANCE_MS + 1


# -- several processes ---------------------------------------------------------------------------

#: answers that decide nothing yet: a win not confirmed durable in time (a replica slow to
#: acknowledge on a loaded host) and an outcome the store could not tell; both are "not sent"
UNDECIDED = (Outcome.UNCONFIRMED, Outcome.UNKNOWN)


def _decided(store, result):
    """The claim's answer once the store decided it: an undecided claim is asked again, as its
    winner's retry would, until max_late (the claim's own window) has passed. A retried win is
    still this instance's; a retry never makes a second winner (the contract under test)."""
    deadline = result.request.slot_ms + result.request.max_late_ms
    while result.outcome in UNDECIDED and time.time() * 1000 < deadline:
        (result,) = store.claim([result.request])
    return result


def _race(url, namespace, instance_id, runs, barrier, queue, batch, options=None,
          in_slot_order=False):
    """One racer (a process or a thread): claims ``runs`` (``(entry, slot)`` pairs) in batches
    of ``batch`` once every racer is at ``barrier``, and puts ``(instance_id, runs won, error)``
    on ``queue``."""
    from celery_anarchon.stores import open_store
    store = open_store(url, namespace=namespace, instance_id=instance_id, options=options)
    won = []
    order = list(runs)
    random.Random(instance_id).shuffle(order)
    if in_slot_order:
        order.sort(key=lambda run: run[1])
    try:
        barrier.wait(timeout=30)
        for i in range(0, len(order), batch):
            part = [req(entry, slot) for entry, slot in order[i:i + batch]]
            for result in store.claim(part):
                result = _decided(store, result)
                assert result.outcome in (Outcome.WON, Outcome.OTHER_WON), result
                if result.outcome is Outcome.WON:
                    assert result.winner == instance_id
                    won.append(result.request.run)
                else:
                    assert result.winner != instance_id, result
                    # a store that cannot read the winner back (RabbitMQ) answers winner=None
                    assert result.winner is not None or not store.recognises_winner, result
        queue.put((instance_id, won, None))
    except BaseException as exc:  # report, never hang the parent
        queue.put((instance_id, won, repr(exc)))
    finally:
        store.close()
