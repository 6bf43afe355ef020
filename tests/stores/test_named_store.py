"""A store another package provides, named by ``anarchon_store_url`` as
``"package.module:Class"`` (:func:`celery_anarchon.stores.named_store`), as kombu takes a
transport class by name."""
from __future__ import annotations

import uuid

import pytest

from celery_anarchon.errors import ConfigError
from celery_anarchon.stores import ClaimRequest, Outcome, open_store
from celery_anarchon.stores.base import LATENESS_TOLERANCE_MS

from engine_support import T0_MS, StoreClock, ThirdPartyStore


def test_a_store_named_by_its_class_is_built_with_its_options_and_claims():
    clock = StoreClock(T0_MS)
    store = open_store("engine_support:ThirdPartyStore", namespace="n", instance_id="A",
                       options={"server": uuid.uuid4().hex, "memory": 60, "clock": clock})
    assert type(store) is ThirdPartyStore and store.url == "engine_support:ThirdPartyStore"
    assert store.memory.duration_s == 60 and store.leases is not None
    store.prepare(["e"])
    slot = T0_MS + 2 * LATENESS_TOLERANCE_MS          # after the memory start, not forgotten
    clock.now = slot
    (result,) = store.claim([ClaimRequest("e", slot, max_late_ms=5_000)])
    assert result.outcome is Outcome.WON


@pytest.mark.parametrize("url, expected", [
    ("no_such_package_here.stores:Store", "No module named 'no_such_package_here'"),
    ("engine_support:NoSuchStore", "has no attribute 'NoSuchStore'"),
    ("engine_support:T0", "not a store class or a factory of one"),
    ("engine_support:not_a_store", "built dict, which is not a store"),
])
def test_a_named_store_that_cannot_serve_is_a_config_error_naming_it(url, expected):
    with pytest.raises(ConfigError) as info:
        open_store(url, namespace="n", instance_id="A")
    assert url in str(info.value) and expected in str(info.value), info.value
