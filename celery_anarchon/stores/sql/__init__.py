"""The SQL stores, PostgreSQL and SQLite (docs/design.md store memory table): one unit.

* :mod:`.store`: :class:`~.store.SQLStore`, what both share: claims and history in one
  transaction per batch, the parts joined;
* :mod:`.postgresql`, :mod:`.sqlite`: what differs per server (:class:`PostgreSQLStore`,
  :class:`SQLiteStore`, each with its connection);
* :mod:`.connection`: the engine of each process, one transaction per operation, driver errors;
* :mod:`.options`: the options (``memory``; PostgreSQL's ``durability``, ``confirm_timeout``);
* :mod:`.schema`: the tables (SQLAlchemy Core) and the server clock in SQL;
* :mod:`.memory`: the store-wide memory start, the epoch, and the entries' fences;
* :mod:`.claims`: the claim decisions of a batch (already claimed, paused, forgotten, ...);
* :mod:`.history`: history and definitions;
* :mod:`.leases`: the lease operations and the fencing tokens;
* :mod:`.entries`: store entries and pauses, with run-now requests in :mod:`.requests`;
* :mod:`.instances`: instance records (heartbeats) and fingerprint mappings.
"""
from celery_anarchon.stores.sql.postgresql import PostgreSQLStore  # noqa: F401
from celery_anarchon.stores.sql.sqlite import SQLiteStore  # noqa: F401
