"""A real HTTP server on loopback whose answers a test writes as a Python function: the
vendors' behaviours the fakes of :mod:`dw_dagster_dev.fakes` do not script (a list that
shifts between two page requests, a total larger than the items sent)."""

import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable
from contextlib import contextmanager

#: ``answer(method, path, query, body) -> (status, json body)``; ``query`` maps names to their first value
Answer = Callable[[str, str, dict, object], tuple[int, object]]


@contextmanager
def serve(answer: Answer):
    """Serve ``answer`` on 127.0.0.1 (a free port); yields ``(base_url, seen)``, ``seen`` the
    requests as ``"METHOD path?query"``."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _handle(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            url = urllib.parse.urlsplit(self.path)
            query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
            seen.append(f"{self.command} {self.path}")
            status, body = answer(self.command, url.path, query, json.loads(raw) if raw else None)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _handle

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()
