"""A TCP proxy on loopback that a test can cut, standing in for a database server that goes away.

The PostgreSQL server on this machine is shared by every developer's tests, so a test that needs
"PostgreSQL is down for 20 s" does not stop it: the Dagster storage's URL points at this proxy
instead, and :meth:`TcpProxy.cut` makes the server unreachable for a while, the way a crash or a
failover looks to a client:

- every open connection is closed at once (both directions, so the client sees the server close
  the connection mid-statement);
- the listening socket is closed, so new connections are refused (``ECONNREFUSED``) until the
  cut ends, when it listens again on the same port.

Each accepted connection is relayed by two threads (one per direction) to the upstream address.
"""

from __future__ import annotations

import socket
import threading
import time


class TcpProxy:
    """Relay ``127.0.0.1:<port>`` to ``upstream``; :meth:`cut` it for a while. Use as a context manager."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.port = port
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._down = threading.Event()
        self.cuts: list[tuple[float, float]] = []  # (start, end) wall-clock times of each cut
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def __enter__(self) -> "TcpProxy":
        self._listen()
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._close_listener()
        self._drop_all()

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        s.settimeout(0.2)
        self.port = s.getsockname()[1]
        self._listener = s

    def _close_listener(self) -> None:
        s, self._listener = self._listener, None
        if s is not None:
            s.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            s = self._listener
            if s is None or self._down.is_set():
                time.sleep(0.05)
                continue
            try:
                client, _ = s.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._conns.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), name="tcp-proxy-pipe", daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._close(s)

    def _close(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def _drop_all(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            self._close(s)

    def cut(self, seconds: float) -> tuple[float, float]:
        """Drop every connection and refuse new ones for ``seconds``; returns (start, end) wall-clock times."""
        start = time.time()
        self._down.set()
        self._close_listener()
        self._drop_all()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._drop_all()  # anything that slipped in while the listener closed
            time.sleep(0.1)
        self._listen()
        self._down.clear()
        end = time.time()
        self.cuts.append((start, end))
        return start, end

    def cut_in_background(self, seconds: float) -> threading.Thread:
        """:meth:`cut` in a thread (join it to wait for the end)."""
        t = threading.Thread(target=self.cut, args=(seconds,), name="tcp-proxy-cut", daemon=True)
        t.start()
        return t


__all__ = ["TcpProxy"]
