"""The TCP proxy of the tests and the rigs (tests/support/tcp_proxy.py) against a small server of this
test: what the rigs rely on (pg_basebackup -X stream runs two connections through one proxy)."""
from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading

from stores_support import wait_until
from tcp_proxy import TCPProxy


def test_a_connection_whose_peer_reads_nothing_never_stops_another():
    """Connection A sends more than the kernel buffers while its server reads nothing, so the
    proxy's send on A blocks; connection B through the same proxy still gets its echo, and
    pause() / cut() still return (a blocked send on one connection held every other one)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            if len(accepted) == 2:          # B: echo what comes; A: never read
                threading.Thread(target=lambda c=conn: c.sendall(c.recv(100)), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    proxy = TCPProxy(listener.getsockname()).start()
    try:
        a = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        wait_until(lambda: len(accepted) == 1, 10, "A to reach the server")
        a.setblocking(False)
        queued = [-1]

        def a_is_stuck() -> bool:
            """A refuses more and the server's queue of A stopped growing: the proxy's send on A
            is blocked (the server reads nothing)."""
            try:
                while True:
                    a.send(b"x" * 65536)
            except BlockingIOError:
                pass
            now = struct.unpack("i", fcntl.ioctl(accepted[0], termios.FIONREAD, b"\0" * 4))[0]
            stuck, queued[0] = now == queued[0], now
            return stuck
        wait_until(a_is_stuck, 20, "the proxy's send on A to block", interval=0.2)
        b = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        b.sendall(b"ping")
        assert b.recv(100) == b"ping"
        done = threading.Event()
        threading.Thread(target=lambda: (proxy.pause(), proxy.cut(), done.set()), daemon=True).start()
        assert done.wait(10), "pause() / cut() waited for a send that cannot finish"
    finally:
        proxy.close()
        listener.close()
        for conn in accepted:
            conn.close()
