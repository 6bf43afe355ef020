"""What the Redis store reads and judges about its server: the version, AOF and replicas
(:func:`server_facts`), how a won claim is confirmed durable (:func:`plan_confirmation`, the
``durability`` option), what a confirmation lacked (:func:`missing_confirmation`) and so why a
batch's wins are not confirmed (:func:`unconfirmed_detail`) or an entry-store write fails
(:func:`unconfirmed_write`), the start-up warnings about what the server may lose
(:func:`warnings`), and the one pipelined round trip of scripts and their confirmation that the
Redis and Redis Cluster stores share (:func:`run_scripts`).

Functions of the values they are given (no store object): the store calls them with its options
and with the replicas online as the scripts count them (``online_replicas`` in :mod:`.scripts`,
read at start-up by the settings script: one rule for the plan, the warnings and every batch).
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import redis
from redis.commands.core import Script

from celery_anarchon.errors import ConfigError, StoreError
from celery_anarchon.stores.redis.options import _EVICTING, MIN_VERSIONS, WAITAOF_VERSION


def server_version(client: redis.Redis) -> tuple[str, tuple[int, ...] | None]:
    """``redis_version`` of ``INFO server`` as text and (major, minor); None if unreadable."""
    text = ""
    try:
        text = str(client.info("server").get("redis_version", ""))
        return text, tuple(int(p) for p in text.split(".")[:2])
    except (redis.exceptions.ResponseError, ValueError):
        return text, None


def check_version(client: redis.Redis, strategy: str, safe_url: str) -> None:
    """ConfigError when the server is older than ``strategy`` needs (naming its version and the
    strategies that work on it).

    :raises ConfigError: the server is too old for ``strategy``.
    :raises redis.exceptions.RedisError: the server did not answer (the caller translates it).
    """
    text, version = server_version(client)
    need = MIN_VERSIONS[strategy]
    if version is not None and version < need:
        usable = [s for s, v in MIN_VERSIONS.items() if version >= v]
        raise ConfigError(
            f"Redis store {safe_url}: the server runs Redis {text}, and the strategy "
            f"{strategy!r} needs Redis >= {'.'.join(map(str, need))}. "
            + (f"Strategies that work on Redis {text}: {', '.join(map(repr, usable))}; set "
               "anarchon_store_options['strategy'] to one of them, or upgrade the server."
               if usable else "No strategy works on it: upgrade the server."))


def server_facts(client: redis.Redis, replicas: int) -> dict:
    """What durability depends on: ``version_text``, ``version``, ``aof`` (bool), ``fsync``
    (appendfsync, "" if unreadable), and ``replicas``: the replicas online, as given.

    :raises redis.exceptions.RedisError: the server did not answer (the caller translates it).
    """
    text, version = server_version(client)
    facts = {"version_text": text, "version": version, "aof": False, "fsync": "",
             "replicas": int(replicas)}
    with contextlib.suppress(redis.exceptions.ResponseError):
        facts["aof"] = str(client.info("persistence").get("aof_enabled", "0")) == "1"
    with contextlib.suppress(redis.exceptions.ResponseError):
        facts["fsync"] = client.config_get("appendfsync").get("appendfsync", "")
    return facts


def plan_confirmation(facts: dict, *, durability: str, min_replicas: int,
                      safe_url: str) -> tuple[int | None, bool]:
    """(replicas to wait for, ``None``: as many as are live per batch; wait for the AOF) for the
    ``durability`` option on a server with ``facts``.

    :raises ConfigError: durability ``aof`` / ``replica+aof`` without WAITAOF (Redis < 7.2) or
        without AOF.
    """
    has_waitaof = facts["version"] is not None and facts["version"] >= WAITAOF_VERSION
    if "aof" in durability and durability != "auto":
        if not has_waitaof:
            raise ConfigError(
                f"Redis store {safe_url}: durability={durability!r} confirms the AOF fsync with "
                f"WAITAOF, which needs Redis >= 7.2; the server runs Redis "
                f"{facts['version_text']}. Use durability 'replica' or 'auto', or upgrade.")
        if not facts["aof"]:
            raise ConfigError(
                f"Redis store {safe_url}: durability={durability!r} needs the server's AOF "
                "('appendonly yes'), which is off; turn it on or choose another durability.")
    if durability == "none":
        return 0, False
    if durability == "auto":
        return None, facts["aof"] and has_waitaof
    return (min_replicas if "replica" in durability else 0), "aof" in durability


def missing_confirmation(reply: dict, *, acked: int, live: int, aof: bool, fsynced: bool,
                         auto: bool, replica_grace: float) -> str:
    """What a confirmation (WAIT / WAITAOF) of a batch of writes lacked, ``""`` when it is
    confirmed: the one rule for claims, takeovers and entry-store writes.

    :param reply: the reply of the script that counted the replicas (``now``; with ``auto``:
        ``online``, ``seen``, ``held``).
    :param acked: replicas that acknowledged (WAIT); ``live``: replicas that had to.
    :param fsynced: the AOF fsync was confirmed (WAITAOF), needed when ``aof``.
    :param auto: durability "auto"; ``replica_grace``: its option, seconds.
    :returns: e.g. ``"0 of 1 replica acknowledged"``; parts joined by ``"; "``.
    """
    missing = []
    if live and acked < live:
        missing.append(f"{acked} of {live} replica{'s' if live != 1 else ''} acknowledged")
        if auto and reply.get("held"):
            online, seen = int(reply.get("online", 0)), int(reply["seen"])
            missing.append(
                f"the master has {online} replica{'s' if online != 1 else ''} online, but "
                f"{seen} replica{'s' if seen != 1 else ''} confirmed claims "
                f"{(int(reply['now']) - int(reply['held'])) / 1000:g} s ago, within "
                f"replica_grace = {replica_grace:g} s, and a claim needs a majority of "
                f"them ({live}): it may be an old master cut off by a failover, or one side "
                "of a split")
    if aof and not fsynced:
        missing.append("the AOF fsync was not confirmed")
    return "; ".join(missing)


def unconfirmed_detail(missing: str, *, confirm_timeout: float) -> str:
    """Why the wins of a claim (or takeover) batch are not confirmed, ``""`` when they are.

    :param missing: :func:`missing_confirmation`'s text.
    :param confirm_timeout: seconds each confirmation waited.
    """
    if not missing:
        return ""
    return (f"won, but not confirmed durable within {confirm_timeout:g} s ({missing}): "
            "not sent, so a failover cannot make it run twice")


def unconfirmed_write(where: str, doing: str, missing: str, *,
                      confirm_timeout: float) -> StoreError:
    """The error of an entry-store write the master applied but did not confirm durable.

    :param where: names the store (masked URL) and namespace.
    :param doing: the write (``"pause 'e3'"``).
    :param missing: :func:`missing_confirmation`'s text (not empty).
    :param confirm_timeout: seconds the confirmation waited.
    """
    return StoreError(
        f"{where}: {doing} was written on the master but not confirmed durable within "
        f"{confirm_timeout:g} s ({missing}): the change may be lost if the master fails over "
        "now; repeat it once the replicas are back")


def warnings(client: redis.Redis, facts: dict, confirm: tuple[int | None, bool], *, safe_url: str,
             durability: str, allow_eviction: bool) -> list[str]:
    """The start-up warnings: no data on disk, an evicting ``maxmemory-policy`` (with
    ``allow_eviction``), no replica and no ``appendfsync always``, fewer replicas than needed,
    AOF without WAITAOF.

    :param confirm: the plan of :func:`plan_confirmation`.
    :raises ConfigError: ``maxmemory-policy`` may evict the store's keys and not ``allow_eviction``.
    """
    settings = {}
    try:
        for name in ("save", "appendonly", "maxmemory-policy"):
            settings.update(client.config_get(name))
    except redis.exceptions.ResponseError:  # CONFIG refused (managed Redis): ask INFO
        with contextlib.suppress(redis.exceptions.ResponseError):
            info = client.info("persistence")
            if str(info.get("aof_enabled", "0")) == "1":
                settings["appendonly"] = "yes"
            settings["maxmemory-policy"] = client.info("memory").get("maxmemory_policy", "")
    out = []
    if settings.get("save") == "" and settings.get("appendonly") == "no":
        out.append(
            f"Redis store {safe_url}: this Redis keeps no data on disk (CONFIG save is "
            "empty and appendonly is no), so a restart forgets every claim. Amnesia protection "
            "turns that into recorded misses ('store forgot'), never duplicates, but runs due "
            "around a restart are lost. Configure 'appendonly yes' (or RDB snapshots, e.g. "
            "'save 60 1') on this server.")
    policy = settings.get("maxmemory-policy", "")
    if policy in _EVICTING or policy.startswith("allkeys-"):
        text = (f"Redis store {safe_url}: maxmemory-policy is {policy}, which may evict the "
                "store's keys: an evicted claim lets a run be won twice (partial loss of "
                "writes that no epoch detects). Use 'noeviction' or a volatile-* policy (the "
                "store's keys carry no TTL)")
        if not allow_eviction:
            raise ConfigError(text + ", or set anarchon_store_options['allow_eviction'] = True"
                              " to accept that risk.")
        out.append(text + "; allow_eviction=True gives up the guarantee.")
    replicas, aof = confirm
    if durability == "auto" and not facts["replicas"] and facts["fsync"] != "always":
        out.append(
            f"Redis store {safe_url}: this Redis has no replica and no AOF with "
            "'appendfsync always', so a crash may lose the newest claims. Each restart is a "
            "new epoch: the runs due around it are refused ('store forgot'), never run twice, "
            "but they are missed. For durable claims add a replica (durability 'auto' waits "
            "for it) or set 'appendonly yes' with 'appendfsync always'.")
    if replicas and facts["replicas"] < replicas:
        out.append(
            f"Redis store {safe_url}: durability={durability!r} needs {replicas} "
            f"replica(s) to acknowledge each claim; the master has {facts['replicas']} "
            "connected and acknowledging now: until more connect, every claim is answered "
            "unconfirmed (not sent).")
    if durability == "auto" and facts["aof"] and not aof:
        out.append(
            f"Redis store {safe_url}: the server uses AOF but runs Redis "
            f"{facts['version_text']}, which has no WAITAOF (Redis >= 7.2): claims are not "
            "confirmed on disk" + ("" if facts["fsync"] == "always" else
                                   f" and appendfsync is {facts['fsync']!r}, so a crash may "
                                   "lose the newest ones (a new epoch refuses their slots)")
            + ".")
    return out


class Round(NamedTuple):
    """What :func:`run_scripts` returns: ``replies`` (one per call, JSON decoded), ``acked``
    (replicas that acknowledged the WAIT; 0 when none was asked), ``fsynced`` (WAITAOF saw the
    writes in the AOF; True also when ``aof_optional`` and the server refused WAITAOF) and
    ``aof_refused`` (that refusal: the caller reads the server's setup again)."""

    replies: list
    acked: int
    fsynced: bool
    aof_refused: bool


def run_scripts(client: redis.Redis, scripts: Mapping[str, Script],
                calls: Sequence[tuple[str, list, list, bool]], *, replicas: int, aof: bool,
                timeout_s: float, aof_optional: bool = False) -> Round:
    """One pipelined round trip to one server: EVALSHA of each call, then ``WAIT replicas`` (when
    ``replicas`` > 0) and ``WAITAOF 1 0`` (when ``aof``), so the confirmation covers every write
    of the round on the same connection. After NOSCRIPT (a restarted or failed-over server) the
    scripts are loaded and the pipeline sent once more, without the calls marked ``once`` that
    ran: an entry-store write is never run twice.

    :param scripts: the registered scripts by name (``.sha``, ``.script``).
    :param calls: (script name, keys, args, once) per call, keys and args complete.
    :param timeout_s: seconds WAIT and WAITAOF may wait (``confirm_timeout``).
    :param aof_optional: durability "auto": a WAITAOF the server refuses (AOF turned off, or a
        failover to a master without it) is no failure; the round says so (``aof_refused``).
    :raises redis.exceptions.RedisError: a call or the confirmation failed (an error reply, the
        connection); NoScriptError when the scripts could not be loaded.
    """
    timeout_ms = max(1, round(timeout_s * 1000))
    got: list = [None] * len(calls)
    pending = list(range(len(calls)))
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for i in pending:
            name, keys, args, _once = calls[i]
            pipe.evalsha(scripts[name].sha, len(keys), *keys, *args)
        if replicas:
            pipe.execute_command("WAIT", replicas, timeout_ms)
        if aof:
            pipe.execute_command("WAITAOF", 1, 0, timeout_ms)
        replies = pipe.execute(raise_on_error=False)
        tail = replies[len(pending):]
        for i, r in zip(pending, replies):
            got[i] = r
        lost = [i for i in pending if isinstance(got[i], redis.exceptions.NoScriptError)]
        if lost:
            for name in {calls[i][0] for i in lost}:
                client.script_load(scripts[name].script)
            pending = [i for i in pending if not calls[i][3] or i in lost]
            continue
        refused = bool(aof and aof_optional and isinstance(tail[-1], Exception))
        if refused:
            tail[-1] = [1, 0]
        for r in (*got, *tail):
            if isinstance(r, Exception):
                raise r
        return Round([json.loads(r) for r in got], int(tail[0]) if replicas else 0,
                     bool(aof and int(tail[-1][0]) >= 1), refused)
    raise redis.exceptions.NoScriptError(
        f"the {', '.join(sorted({c[0] for c in calls}))} script(s) could not be loaded")
