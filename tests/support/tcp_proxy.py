"""A small TCP proxy for fault injection in front of a real server (no mock of the server).

It can refuse new connections and cut existing ones (an outage), swallow the server's replies (a
claim that reached the store but whose answer never came back), delay traffic (latency), and stop
forwarding while keeping every byte (:meth:`TCPProxy.pause`: a replica that lags behind its
master, since loopback replication is otherwise sub-millisecond), then drop what it held
(:meth:`TCPProxy.cut`: a primary that crashed before its standby got the newest WAL).

The one proxy of the tests and the benchmarks (the Redis and PostgreSQL rigs' replication goes
through it, and chaos runs' store connections).
"""
from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlsplit


def redis_address() -> tuple[str, int]:
    """Host and port of the Redis the tests use (ANARCHON_TEST_REDIS_URL)."""
    from conftest import REDIS_URL
    parts = urlsplit(REDIS_URL)
    return parts.hostname or "127.0.0.1", parts.port or 6379


class TCPProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``; start with :meth:`start`, stop with :meth:`close`.

    :param target: ``(host, port)`` of the real server.
    :param nodelay: ``TCP_NODELAY`` on both sides, so a small write goes at once (the PostgreSQL
        rig: a commit's WAL must not wait for an ACK). Off by default: with it, a replica of the
        Redis rig missed the tests' 0.4 s confirmation of a claim now and then (6 of 72 runs of
        the replica tests; 0 of 60 without).
    """

    def __init__(self, target: tuple[str, int], *, nodelay: bool = False) -> None:
        self.target = target
        self.nodelay = nodelay
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.up = True                 # False: refuse new connections, cut the open ones
        self.swallow_replies = False   # True: server -> client bytes are dropped
        self.delay_s = 0.0             # added before forwarding each chunk
        self.paused = False            # True: nothing is read or forwarded (the kernel buffers it)
        self.accepted = 0              # connections accepted so far
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._gate = threading.Lock()  # held while a chunk is read (never while it is sent)
        self._closed = False

    def start(self) -> TCPProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def url(self, scheme: str, path: str = "") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def outage(self) -> None:
        """Cut every open connection and refuse new ones until :meth:`restore`."""
        self.up = False
        self._cut_open()

    def cut(self) -> None:
        """Cut every open connection, dropping what :meth:`pause` held back; new connections are
        accepted and forwarded again (a replication link that breaks and reconnects)."""
        self._cut_open()
        self.paused = False

    def _cut_open(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def pause(self) -> None:
        """Stop forwarding in both directions without losing a byte: what was sent waits in the
        kernel's buffers (both peers see a live connection) until :meth:`resume`."""
        self.paused = True
        with self._gate:  # a chunk being read now was sent before; nothing after it is read
            pass

    def resume(self) -> None:
        """Forward again what :meth:`pause` held back, then everything after it."""
        self.paused = False

    def restore(self) -> None:
        self.up = True
        self.swallow_replies = False
        self.delay_s = 0.0
        self.paused = False

    def close(self) -> None:
        self._closed = True
        self.outage()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)     # the timeout is the connect's, not every send's
            except OSError:
                client.close()
                continue
            if self.nodelay:
                for s in (client, server):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        sockets = [client, server]
        try:
            while not self._closed:
                if self.paused:
                    time.sleep(0.01)
                    continue
                readable, _, _ = select.select(sockets, [], [], 0.2)
                for source in readable:
                    with self._gate:  # pause() waits for a chunk being read, then none is read
                        if self.paused:
                            break
                        data = source.recv(65536)
                    if not data:
                        return
                    # what was read before pause() returned is forwarded; the gate is not held
                    # while sending: a peer that reads nothing must not stop other connections
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    if source is server and self.swallow_replies:
                        continue
                    (server if source is client else client).sendall(data)
        except (OSError, ValueError):       # cut: the sockets were closed under us
            return
        finally:
            for s in sockets:
                try:
                    s.close()
                except OSError:
                    pass
