"""The NATS JetStream store (DESIGN.md store memory table: NATS): one unit.

* :mod:`.store`: :class:`NATSStore`, claims by ``Nats-Msg-Id`` deduplication in a stream;
* :mod:`.history`: history and definitions in a key-value bucket;
* :mod:`.io`: the client session on its own event loop thread and the JetStream API replies.
"""
from celery_anarchon.stores.nats.store import NATSStore  # noqa: F401
