"""Serve an ASGI app (the approvals endpoint) with uvicorn in a thread on a free loopback port, for tests."""

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def serve(make_app, lifespan: str = "off"):
    """Run ``make_app(base_url)`` with uvicorn in a thread on a free loopback port; yield the base URL.

    ``lifespan="on"`` for apps that start work in their lifespan (the MCP streamable HTTP app).
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(make_app(base), log_level="warning", lifespan=lifespan))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the approvals server did not start"
        time.sleep(0.02)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
