"""What the Redis Cluster store adds to the key layout and the options: the ``redis+cluster://``
URL (:func:`parse_cluster_url`) and the keys of one hash slot (:class:`SlotKeys`).

Redis Cluster runs a script only on keys of one hash slot. Every key of an entry shares the
entry's hash tag (``{<namespace>:<entry>}``: one slot); the claim scripts also read and write a
store-wide hash (epoch, memory start, memory settings, replicas seen) and the pauses: on a
Cluster these are kept **per hash slot**, under a tag of the namespace made to fall in that slot::

    <key_prefix>:{<namespace>:#<n>}:store     the slot's store-wide hash (scripts.STORE_FIELDS)
    <key_prefix>:{<namespace>:#<n>}:pauses    the pauses of the entries of that slot

where ``n`` is the smallest number whose tag ``<namespace>:#<n>`` hashes to the slot (CRC16 mod
16384, as Redis does). Entry names are percent-escaped (``#`` becomes ``%23``), so no entry's tag
can be one of these. The epoch is then the ``run_id`` of the node serving the slot, and the
memory start, the settings rule and the replica count are the slot's: a failover of one master
restarts the memory of its slots only.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, quote, unquote, urlsplit

from redis.crc import key_slot

from celery_anarchon._util import mask_url
from celery_anarchon.errors import ConfigError

#: Hash slots of a Redis Cluster.
SLOTS = 16384
#: Schemes of the Cluster store: ``rediss+cluster`` connects with TLS.
SCHEMES = ("redis+cluster", "rediss+cluster")
#: URL query parameters passed to redis-py (TLS files and checks, the client name).
QUERY_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "client_name")


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict]:
    """The startup nodes and the connection arguments of ``redis+cluster://[user:password@]
    host:port[,host:port...]/`` (``rediss+cluster://``: TLS).

    :returns: ([(host, port), ...], kwargs for ``RedisCluster``: ``ssl``, ``username``,
        ``password`` and the query parameters of :data:`QUERY_PARAMETERS`).
    :raises ConfigError: no node, a node without a port, a database other than 0 (a Cluster has
        only db 0), or an unknown query parameter; each names the masked URL and the fix.
    """
    safe = mask_url(url)
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"anarchon_store_url {safe!r}: not a Redis Cluster URL ({', '.join(SCHEMES)})")
    kwargs: dict = {"ssl": parts.scheme == "rediss+cluster"}
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            kwargs["username"] = unquote(user)
        if password:
            kwargs["password"] = unquote(password)
    nodes = []
    for part in filter(None, hosts.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"anarchon_store_url {safe!r}: {part!r} is not host:port; list the "
                              "startup nodes as redis+cluster://host1:6379,host2:6379/")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ConfigError(f"anarchon_store_url {safe!r}: no startup node; give at least one, e.g. "
                          "redis+cluster://10.0.0.1:6379,10.0.0.2:6379/")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"anarchon_store_url {safe!r}: a Redis Cluster has only database 0; "
                          "drop the path (use anarchon_namespace or key_prefix to separate apps)")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in QUERY_PARAMETERS:
            raise ConfigError(f"anarchon_store_url {safe!r}: query parameter {name!r} is not "
                              f"understood; allowed: {', '.join(QUERY_PARAMETERS)}")
        kwargs[name] = value
    return nodes, kwargs


class SlotKeys:
    """The per-slot keys of one namespace (see the module docstring), found once per slot.

    :param key_prefix: the store's ``key_prefix``.
    :param namespace: the namespace (percent-escaped here).
    """

    def __init__(self, key_prefix: str, namespace: str) -> None:
        self.key_prefix = key_prefix
        self._ns = quote(namespace, safe="")
        self._tag_of: dict[int, int] = {}   # slot -> smallest n whose tag hashes to it
        self._scanned = 0                   # every n below this is in _tag_of (or a larger n's slot)

    def slot_of_entry(self, entry: str) -> int:
        """The hash slot of every key of ``entry`` (its tag ``<namespace>:<entry>``)."""
        return key_slot(f"{self._ns}:{quote(entry, safe='')}".encode())

    def _tag(self, slot: int) -> str:
        # scan n upwards once for all slots: the first n seen for a slot is its smallest
        while slot not in self._tag_of:
            n = self._scanned
            self._tag_of.setdefault(key_slot(f"{self._ns}:#{n}".encode()), n)
            self._scanned = n + 1
        return f"{self._ns}:#{self._tag_of[slot]}"

    def head(self, slot: int) -> list[str]:
        """The keys every claim-side script takes first for a block of entries of ``slot``: the
        slot's store-wide hash, then its pauses."""
        start = f"{self.key_prefix}:{{{self._tag(slot)}}}"
        return [f"{start}:store", f"{start}:pauses"]

    def pause_versions(self, slot: int) -> str:
        """The hash of the slot's pause versions (entry name -> the entries version of its last
        pause or resume, so that the newest write wins)."""
        return f"{self.key_prefix}:{{{self._tag(slot)}}}:pauses:version"
