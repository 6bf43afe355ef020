"""The SQL stores' options: validated once, with ConfigError naming the option, the value and the
rule (the numbers by :mod:`celery_anarchon._util`'s validators). Every SQL store takes ``memory``
(and the common ``history_size`` and ``claim_timeout``); PostgreSQL adds ``durability`` and
``confirm_timeout`` (:mod:`.postgresql`).
"""
from __future__ import annotations

import datetime as dt

from celery_anarchon._util import seconds
from celery_anarchon.errors import ConfigError

#: Options of ``anarchon_store_options`` every SQL store understands (besides the common ones).
OPTIONS = frozenset({"memory"})
#: The PostgreSQL store's own options.
POSTGRESQL_OPTIONS = frozenset({"durability", "confirm_timeout"})

#: ``durability`` values of the PostgreSQL store -> what they promise (docs/stores.md)
DURABILITY = {
    "auto": "claims wait for the synchronous standbys when synchronous_standby_names is set",
    "local": "claims never wait for a standby (the primary's disk only)",
    "standby": "claims wait for a synchronous standby; synchronous_standby_names must be set",
}


def durability(value: object) -> str:
    """The PostgreSQL ``durability`` option: one of :data:`DURABILITY`.

    :raises ConfigError: another value (naming each choice and what it promises).
    """
    if value not in DURABILITY:
        choices = "; ".join(f"{k!r}: {v}" for k, v in DURABILITY.items())
        raise ConfigError(f"anarchon_store_options['durability'] = {value!r}: must be one of "
                          f"{choices}")
    return str(value)


def confirm_timeout(value: float | dt.timedelta | None, claim_timeout: float) -> float:
    """The PostgreSQL ``confirm_timeout`` option, seconds: how long a commit may wait for the
    synchronous standbys (default 2, or half of ``claim_timeout`` if lower, as on Redis).

    :raises ConfigError: not a positive duration, or not below ``claim_timeout``.
    """
    timeout = min(2.0, claim_timeout / 2) if value is None else seconds("confirm_timeout", value)
    if timeout >= claim_timeout:
        raise ConfigError(
            f"anarchon_store_options['confirm_timeout'] = {timeout:g} s must be below "
            f"claim_timeout = {claim_timeout:g} s (a claim's round trip includes the wait "
            "for the standby); lower confirm_timeout or raise claim_timeout")
    return timeout
