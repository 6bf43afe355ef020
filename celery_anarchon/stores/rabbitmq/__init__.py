"""The RabbitMQ store (docs/design.md store memory table: RabbitMQ): one unit.

* :mod:`.store`: :class:`RabbitMQStore`, a claim is a publish to a one-message queue per run;
* :mod:`.claims`: the claim queues (the broker's probe, the slot_ttl marker, declare, publish);
* :mod:`.entries`: per-entry queues (memory start, history, the entry lock);
* :mod:`.instances`: instance records (heartbeats) and fingerprint mappings;
* :mod:`.protocol`: queue names and arguments, message bodies, publisher confirms, the session.
"""
from celery_anarchon.stores.rabbitmq.store import RabbitMQStore  # noqa: F401
