"""The NATS JetStream store (docs/design.md store memory table: NATS): one unit.

* :mod:`.store`: :class:`NATSStore`, the host that holds the connection and joins the parts;
* :mod:`.claims`: claims by ``Nats-Msg-Id`` deduplication in a stream;
* :mod:`.memory`: the ``duplicate_window`` setting and the epoch (amnesia after a restart);
* :mod:`.clock`: the server's clock and this instance's skew to it;
* :mod:`.streams`: the streams, their replicas and the server setup's warnings;
* :mod:`.history`: history and definitions in a key-value bucket;
* :mod:`.instances`: instance records (heartbeats) and fingerprint mappings;
* :mod:`.options`: the options and URLs;
* :mod:`.connection`: the client session on its own event loop thread, the JetStream API
  replies, names.
"""
from celery_anarchon.stores.nats.store import NATSStore  # noqa: F401
