"""A Redis Cluster of our own: six ``redis-server --cluster-enabled yes`` on free loopback ports in
a temporary folder (three masters, one replica each), created with ``redis-cli --cluster create
... --cluster-replicas 1 --cluster-yes`` and ready once every node reports ``cluster_state:ok``.

The tests start one per session (``tests/support/cluster_rig.py``); the failover test asks a replica to
take over its master (``CLUSTER FAILOVER``) or kills a master (``SIGKILL``: the cluster promotes
its replica after ``cluster-node-timeout``, 1 s here).

    python benchmarks/redis_cluster.py        # start one, print its URL, stop on Enter
"""
from __future__ import annotations

import random
import shutil
import signal
import subprocess
import tempfile

from servers import RedisServer, Rig, port_open, wait_for

#: milliseconds a node may stay unreachable before the others fail it over
NODE_TIMEOUT_MS = 1000
#: a cluster node also listens on its port + 10000 (the cluster bus), so its port is at most 55535
BUS_OFFSET = 10000


#: node ports are drawn from here, so that a node's port and its bus port (up to 32767) stay below
#: Linux's default range of ephemeral ports (32768-60999), which an outgoing connection may hold
PORTS = (10000, 22767)
#: the operating system's random source: pytest-randomly reseeds ``random`` before each test, so
#: two test processes (or two rigs of one) would draw the same ports from it
_PICK = random.SystemRandom()


def cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (+10000) is free too (see :data:`PORTS`)."""
    for _ in range(1000):
        port = _PICK.randint(*PORTS)
        if port in taken or port + BUS_OFFSET in taken:
            continue
        if not port_open(port, 0.05) and not port_open(port + BUS_OFFSET, 0.05):
            taken.update((port, port + BUS_OFFSET))
            return port
    raise RuntimeError("no free pair of ports (port, port + 10000) for a cluster node")


def node_port(row: list[str]) -> int:
    """The port of a ``CLUSTER NODES`` row (its address is ``ip:port@busport``)."""
    return int(row[1].split("@")[0].rsplit(":", 1)[1])


def unsettled(table: list[list[str]], live: set[int]) -> str | None:
    """What keeps a ``CLUSTER NODES`` table (rows split on blanks) from showing a settled cluster,
    or None.

    Every live node must be a master serving slots or a replica: right after ``redis-cli
    --cluster create`` returns (it waits for the slots to agree, not the replicas), and when a
    failed master comes back, a replica shows for a few hundred milliseconds as a master serving
    no slot, and its master has no replica in the table yet.

    :param live: the ports of the nodes whose process runs (a dead node's row does not count).
    """
    for row in table:
        port = node_port(row)
        if port in live and "slave" not in row[2] and len(row) <= 8:
            return f"the node on port {port} is a master serving no slot"
    return None


class RedisClusterRig(Rig):
    """Masters and their replicas (:class:`servers.RedisServer`, nothing kept on disk; six nodes
    by default) forming one cluster.

    :param masters: how many masters.
    :param replicas: how many replicas each master gets (1; 0 for a cluster whose claims never
        wait for a replica: the tests' shared rig, whose tests prove what the store does on a
        cluster, not what replication does; the failover tests start rigs with replicas).
    :param folder: where the nodes keep their files (default: a temporary folder, deleted by
        :meth:`close`).
    :param binary: the ``redis-server`` of every node (e.g. Redis 8, for WAITAOF).
    :param args: more ``redis-server`` arguments of every node, after the cluster's own.
    :param env: more environment variables of every node (e.g. a
        :class:`fsync_hold.FsyncHold`'s, a disk whose fsync the test holds back).
    """

    def __init__(self, masters: int = 3, folder: str | None = None, *,
                 binary: str = "redis-server", args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, replicas: int = 1) -> None:
        self._own_folder = folder is None
        self.master_count, self.replicas = masters, replicas
        self.folder = folder or tempfile.mkdtemp(prefix="anarchon-redis-cluster-")
        taken: set[int] = set()
        self.nodes = [
            RedisServer(f"node{i}", self.folder, persistent=False, port=cluster_port(taken), args=(
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # a replica may always be promoted, however long ago it heard from its master
                "--cluster-replica-validity-factor", "0",
                # a replica syncs at once (the default waits 5 s for more replicas to join)
                "--repl-diskless-sync-delay", "0", *args), binary=binary, env=env)
            for i in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def start(self) -> RedisClusterRig:
        """Start the nodes, create the cluster, wait until every node says it is ok.

        :raises RuntimeError: a node did not start, or the cluster was not ok within 30 s.
        """
        taken = {n.port for n in self.nodes} | {n.port + BUS_OFFSET for n in self.nodes}
        for node in self.nodes:
            for attempt in range(3):
                try:
                    node.start()
                    break
                except RuntimeError:   # its port was taken meanwhile: another one
                    node.stop(signal.SIGKILL)
                    if attempt == 2:
                        raise
                    node.port = cluster_port(taken)
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{n.port}" for n in self.nodes),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, text=True, timeout=60)
        self.wait_ok()
        return self

    def cli(self, node: RedisServer, *args: str) -> str:
        """``redis-cli -p <node's port> <args>``: its output."""
        return subprocess.run(["redis-cli", "-p", str(node.port), *args], capture_output=True,
                              text=True, timeout=10).stdout

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node reports ``cluster_state:ok``, the table this rig reads shows every
        live node as a master with slots or a replica (:func:`unsettled`), the cluster has as many
        masters with slots as at the start (a failover is over), and each master whose replica is
        alive has it online (synced: ``WAIT`` can count it, a kill of the master can promote it)."""
        want = self.master_count

        def ok() -> bool:
            for node in self.nodes:
                if not node.alive():
                    continue
                if "cluster_state:ok" not in self.cli(node, "cluster", "info"):
                    return False
            if unsettled(self._table(), {n.port for n in self.nodes if n.alive()}) is not None:
                return False
            masters = self.masters()
            if len(masters) != want:
                return False
            for master in masters:
                try:
                    self.replica_of(master)
                except LookupError:
                    continue
                if "state=online" not in self.cli(master, "info", "replication"):
                    return False
            return True
        wait_for(ok, timeout, "the Redis Cluster to report cluster_state:ok", interval=0.1)

    def _table(self) -> list[list[str]]:
        for node in self.nodes:
            if node.alive():
                return [line.split() for line in self.cli(node, "cluster", "nodes").splitlines()
                        if line.strip()]
        return []

    def masters(self) -> list[RedisServer]:
        """The live nodes that are masters with slots now (per ``CLUSTER NODES``)."""
        by_port = {n.port: n for n in self.nodes}
        found = []
        for row in self._table():
            port = node_port(row)
            if "master" in row[2] and "fail" not in row[2] and len(row) > 8 and by_port[port].alive():
                found.append(by_port[port])
        return found

    def replica_of(self, master: RedisServer) -> RedisServer:
        """The live replica of ``master``.

        :raises LookupError: it has none."""
        table = self._table()
        by_port = {n.port: n for n in self.nodes}
        ids = {node_port(r): r[0] for r in table}
        for row in table:
            if "slave" in row[2] and row[3] == ids.get(master.port):
                node = by_port[node_port(row)]
                if node.alive():
                    return node
        raise LookupError(f"master on port {master.port} has no live replica")

    def master_of_slot(self, slot: int) -> RedisServer:
        """The master serving hash slot ``slot`` now."""
        by_port = {n.port: n for n in self.nodes}
        for row in self._table():
            if "master" not in row[2] or "fail" in row[2]:
                continue
            for part in row[8:]:
                lo, _, hi = part.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return by_port[node_port(row)]
        raise LookupError(f"no master serves slot {slot}")

    def failover(self, master: RedisServer) -> RedisServer:
        """``CLUSTER FAILOVER`` on ``master``'s replica (a manual failover: the master stops
        taking writes, the replica catches up, then takes over); returns the new master once the
        cluster is ok again."""
        replica = self.replica_of(master)
        self.cli(replica, "cluster", "failover")
        wait_for(lambda: replica in self.masters() and master not in self.masters(), 20,
                 f"the replica on port {replica.port} to take over", interval=0.05)
        self.wait_ok()
        return replica

    def kill(self, master: RedisServer) -> RedisServer:
        """SIGKILL ``master``; returns its replica once the cluster promoted it and is ok."""
        replica = self.replica_of(master)
        master.stop(signal.SIGKILL)
        wait_for(lambda: replica in self.masters(), 30,
                 f"the replica on port {replica.port} to be promoted", interval=0.1)
        self.wait_ok()
        return replica

    def close(self) -> None:
        """Stop every node (SIGKILL: nothing to keep) and delete the folder if it is ours."""
        for node in self.nodes:
            if node.alive():
                node.stop(signal.SIGKILL)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    with RedisClusterRig() as rig:
        print(rig.url, flush=True)
        input("Enter stops it. ")
