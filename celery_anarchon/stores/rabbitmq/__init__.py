"""The RabbitMQ store (docs/design.md store memory table: RabbitMQ): one unit.

* :mod:`.store`: :class:`RabbitMQStore`, a claim is a publish to a one-message queue per run;
* :mod:`.claims`: the claim queues (the broker's probe, the slot_ttl marker, declare, publish);
* :mod:`.memory`: each entry's memory start (amnesia) and the lock queues its readers hold;
* :mod:`.history`: each entry's history queue, folded into one record per run;
* :mod:`.instances`: instance records (heartbeats) and fingerprint mappings;
* :mod:`.options`: the options and URLs;
* :mod:`.connection`: queue names and arguments, message bodies, publisher confirms, the
  session.
"""
from celery_anarchon.stores.rabbitmq.store import RabbitMQStore  # noqa: F401
