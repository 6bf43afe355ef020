"""The SQL stores, PostgreSQL and SQLite (docs/design.md store memory table): one unit.

* :mod:`.schema`: the tables (SQLAlchemy Core) and the server clock in SQL;
* :mod:`.store`: :class:`~.store.SQLStore`, claims and history in one transaction per batch;
* :mod:`.memory`: the store-wide memory start, the epoch, and the entries' fences;
* :mod:`.claims`: the claim decisions of a batch (already claimed, paused, forgotten, ...);
* :mod:`.leases`: the lease operations and the fencing tokens;
* :mod:`.entries`: store entries, pauses, run-now requests, instance records (EntryStore);
* :mod:`.postgresql`: what differs per server (:class:`PostgreSQLStore`, :class:`SQLiteStore`).
"""
from celery_anarchon.stores.sql.postgresql import PostgreSQLStore, SQLiteStore  # noqa: F401
