"""The memory store, ``memory://`` (docs/stores.md "memory://"): the reference form of the
store contract and a store for tests, one process only.

* :mod:`.store`: :class:`~.store.MemoryStore`, the URL, its options, the lock and the clock;
* :mod:`.claims`: the claim decision order, rule by rule;
* :mod:`.leases`: adopt, renew, release, requeue, take over, by fencing token;
* :mod:`.notes`: when the memory began (epoch, recorded memory) and each entry's fence;
* :mod:`.history`: one record per run, the rules of who may overwrite it;
* :mod:`.entries`: store entries, pauses, run-now requests, instance records (the ``entries``
  and ``instances`` parts);
* :mod:`.state`: the data, in named servers shared by the stores of one process.
"""
from celery_anarchon.stores.memory.store import MemoryStore  # noqa: F401
