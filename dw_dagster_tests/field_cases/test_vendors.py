"""Field cases of vendors under pressure, through the HTTP layer every client (Lightup, Mage,
PagerDuty, Opsgenie, Slack, Jira, ServiceNow) sends with (:func:`dw_dagster.core.http.send`),
against a scripted loopback server: throttling with odd ``Retry-After`` values, 5xx after a
non-idempotent request."""

import datetime as dt
import email.utils
import json
import http.server
import threading
import time

import httpx
import pytest

from dw_dagster.core.http import HttpApiError, RetryPolicy, send
from dw_dagster_tests.field_cases.kinds import kind

KINDS = [
    kind("vendor-notes-page-cap", "vendors", "Opsgenie notes listed up to a page cap with more remaining "
         "(a partial list would let the check-then-post add a duplicate note)",
         "https://github.com/stickerdaniel/linkedin-mcp-server/pull/876", "dw_dagster/integrations/opsgenie.py",
         "test_opsgenie_notes_never_come_back_partial", True),
    kind("vendor-paging-repeats", "vendors", "a paging cursor that repeats (the server ignores the offset)",
         "https://github.com/n8n-io/n8n/pull/24172", "dw_dagster/integrations/opsgenie.py",
         "test_opsgenie_paging_that_repeats_is_refused", True),
    kind("vendor-retry-after-malformed", "vendors", "a malformed Retry-After (text, signed, NaN) on a 429",
         "https://github.com/anthropics/anthropic-sdk-python/pull/1827", "dw_dagster/core/http.py",
         "test_malformed_retry_after_falls_back_to_backoff", True),
    kind("vendor-retry-after-date", "vendors", "Retry-After as an HTTP-date (RFC 9110) honoured",
         "https://github.com/mloesch/sickle/pull/28", "dw_dagster/core/http.py", "test_retry_after_http_date_is_honoured",
         False),
    kind("vendor-retry-after-huge", "vendors", "a Retry-After far beyond the wait cap: capped, not an hour-long hang",
         "https://github.com/mastra-ai/mastra/issues/23778", "dw_dagster/core/http.py",
         "test_huge_retry_after_is_capped", False),
    kind("vendor-post-5xx-not-replayed", "vendors", "a POST answered 503 is not sent again blindly; a 429 on it is",
         "https://github.com/browser-use/sdk/pull/274", "dw_dagster/core/http.py",
         "test_post_after_5xx_is_not_replayed_but_after_429_is", False),
]


class _Script:
    """What the loopback server answers, one ``(status, headers[, body])`` per request, then 200."""

    def __init__(self):
        self.answers: list[tuple[int, dict]] = []
        self.seen: list[str] = []


@pytest.fixture(scope="module")
def server():
    script = _Script()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            script.seen.append(f"{self.command} {self.path}")
            status, headers, *rest = script.answers.pop(0) if script.answers else (200, {})
            body = json.dumps(rest[0] if rest else {"ok": True}).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield script, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture
def vendor(server):
    script, url = server
    script.answers.clear()
    script.seen.clear()
    with httpx.Client(base_url=url) as client:
        yield script, client


POLICY = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=5.0, timeout_s=5.0)


@pytest.mark.parametrize("value", ["soon", "-3", "1.5junk", "nan", "Mon, 99 Foo 2024 25:61:00 GMT"])
def test_malformed_retry_after_falls_back_to_backoff(vendor, value):
    """anthropic-sdk-python PR #1827 (https://github.com/anthropics/anthropic-sdk-python/pull/1827):
    an invalid ``Retry-After`` date let a conversion error escape the retry loop. ``send`` raised
    ``ValueError: Invalid date value or format "soon"`` from inside its back-off. Right answer: the
    header is ignored (RFC 9110 allows delay-seconds or an HTTP-date only) and the call retries with
    its own back-off and succeeds."""
    script, client = vendor
    script.answers = [(429, {"Retry-After": value})]
    waits = []
    r = send(client, "fake", "GET", "/things", policy=POLICY, sleep=waits.append)
    assert r.status_code == 200 and len(script.seen) == 2
    assert len(waits) == 1 and 0 <= waits[0] <= POLICY.max_wait_s


def test_retry_after_http_date_is_honoured(vendor):
    """sickle PR #28 (https://github.com/mloesch/sickle/pull/28): a 503 whose ``Retry-After`` is a
    date, not a number. Right answer: wait until that instant (about 3 s here), not the default
    back-off."""
    script, client = vendor
    script.answers = [(503, {"Retry-After": email.utils.formatdate(time.time() + 3, usegmt=True)})]
    waits = []
    send(client, "fake", "GET", "/things", policy=POLICY, sleep=waits.append)
    assert len(waits) == 1 and 1.5 <= waits[0] <= 3.01


def test_huge_retry_after_is_capped(vendor):
    """mastra #23778 (https://github.com/mastra-ai/mastra/issues/23778): a Retry-After read as
    decades stalled every retry up to the cap. Right answer: one wait of at most ``max_wait_s``
    (then the call goes on or fails with the vendor's status), never the hour asked for."""
    script, client = vendor
    script.answers = [(429, {"Retry-After": "3600"}), (429, {"Retry-After": "3600"}), (429, {"Retry-After": "3600"})]
    waits = []
    with pytest.raises(HttpApiError, match=r"fake GET /things: HTTP 429"):
        send(client, "fake", "GET", "/things", policy=POLICY, sleep=waits.append)
    assert waits == [POLICY.max_wait_s, POLICY.max_wait_s] and len(script.seen) == 3


def test_post_after_5xx_is_not_replayed_but_after_429_is(vendor):
    """browser-use/sdk PR #274 (https://github.com/browser-use/sdk/pull/274): retry GETs on 5xx,
    but never replay a POST after a 5xx (the server may have applied it); a 429 is a rejection, so
    the POST may be sent again. Right answer: the 503'd POST is sent once and reported
    ``maybe_applied``; the 429'd POST is sent twice and succeeds."""
    script, client = vendor
    script.answers = [(503, {})]
    with pytest.raises(HttpApiError) as e:
        send(client, "fake", "POST", "/notes", policy=POLICY, sleep=lambda s: None, idempotent=False, json={"x": 1})
    assert e.value.maybe_applied and script.seen == ["POST /notes"]
    script.seen.clear()
    script.answers = [(429, {"Retry-After": "0"})]
    r = send(client, "fake", "POST", "/notes", policy=POLICY, sleep=lambda s: None, idempotent=False, json={"x": 1})
    assert r.status_code == 200 and script.seen == ["POST /notes", "POST /notes"]


@pytest.fixture(scope="module")
def paging_fake():
    from dw_dagster_dev.fakes.paging_server import start_paging_server

    server, url = start_paging_server()
    yield server, url
    server.stop()


def _opsgenie(url):
    from dw_dagster.integrations.opsgenie import OpsgenieResource
    from dw_dagster_dev.fakes.paging_server import DEFAULT_OPSGENIE_KEY

    return OpsgenieResource(api_key=DEFAULT_OPSGENIE_KEY, base_url=url, timeout_s=2.0, retry_attempts=2,
                            retry_base_wait_s=0.01, retry_max_wait_s=0.05)


def test_opsgenie_notes_never_come_back_partial(paging_fake):
    """linkedin-mcp-server PR #876 (https://github.com/stickerdaniel/linkedin-mcp-server/pull/876):
    a listing that stopped at ``max_pages`` looked the same as a complete one, so callers could not
    tell. Opsgenie's ``list_notes`` returned the first pages silently; ``add_note(ref=...)`` looks
    its marker up there before posting, so a marker past the cap meant a second note. Right answer
    (the fake's own notes): the full list when the pages suffice, else an error, never a part."""
    from dw_dagster_dev.fakes.paging_server import _og_add_note

    server, url = paging_fake
    server.state.reset()
    og = _opsgenie(url)
    og.create_alert("dw-cap", "late rows")
    (alert,) = [a for a in server.state.og_alerts if a["alias"] == "dw-cap"]
    for i in range(150):
        _og_add_note(server.state, alert, f"note {i}", "dw", "dw", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    with pytest.raises(HttpApiError, match="read 1 pages of notes and more remain"):
        og.list_notes("dw-cap", max_pages=1)
    notes = og.list_notes("dw-cap", max_pages=2)
    assert sorted(n["note"] for n in notes) == sorted(n["note"] for n in server.state.opsgenie_notes("dw-cap"))
    assert len(notes) == 150


def test_opsgenie_paging_that_repeats_is_refused(vendor):
    """n8n PR #24172 (https://github.com/n8n-io/n8n/pull/24172): APIs that answer identical pages
    make a pager loop. A server that ignores ``offset`` sends the same ``paging.next`` forever;
    the client read it ``max_pages`` times and returned 50 copies of one note. Right answer: an
    error naming the repeated offset after the second identical page."""
    script, client = vendor
    page = {"data": [{"note": "x", "owner": "", "createdAt": "2026-01-01T00:00:00Z", "offset": "5"}],
            "paging": {"next": "https://api.opsgenie.com/v2/alerts/a/notes?identifierType=alias&offset=5&direction=next"}}
    script.answers = [(200, {}, page)] * 5
    og = _opsgenie(str(client.base_url).rstrip("/"))
    with pytest.raises(HttpApiError, match="paging.next repeats offset 5"):
        og.list_notes("a")
    assert len(script.seen) == 2
