"""Field cases of Lightup polling (:class:`~dw_dagster.integrations.lightup.LightupClient`, what the
Lightup incident sensor lists every tick), against a real loopback server answering as Lightup's
API does (``{"data": [...], "metadata": {"total": ...}}``) but with fewer items than its total."""

import base64
import json
import time

import pytest

from dw_dagster.core.http import HttpApiError, RetryPolicy
from dw_dagster.integrations.lightup import LightupClient, LightupCredential
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.loopback import serve

KINDS = [
    kind("lightup-list-short-of-total", "vendors", "a Lightup list answer with fewer items than its metadata.total "
         "(a server-side cap or a page)", "https://github.com/amp-labs/connectors/pull/3348",
         "dw_dagster/integrations/lightup.py", "test_a_list_answer_short_of_its_total_is_refused", True),
]

FAST = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=0.05, timeout_s=5.0)


def _b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


ACCESS = f"{_b64({'alg': 'HS256'})}.{_b64({'exp': time.time() + 3600})}.c2ln"


def _incident(i):
    return {"uuid": f"inc-{i}", "updated_ts": 1_700_000_000.0 + i, "filter_uuid": "mon-1", "start_ts": 1_699_990_000.0,
            "end_ts": 1_700_000_000.0, "status": 1}


def _lightup(stored, cap):
    """Lightup's routes the client calls; the incident list holds at most ``cap`` items, its total all."""

    def answer(method, path, query, body):
        if path == "/api/v1/token/refresh/":
            return 200, {"access": ACCESS}
        if path == "/api/v1/workspaces/":
            return 200, [{"uuid": "ws-1", "name": "store-sales"}]
        if path == "/api/v0/ws/ws-1/incidents/":
            return 200, {"data": [_incident(i) for i in stored[:cap]], "metadata": {"total": len(stored)}}
        return 404, {"detail": "Not found."}

    return answer


def test_a_list_answer_short_of_its_total_is_refused():
    """amp-labs/connectors PR #3348 (https://github.com/amp-labs/connectors/pull/3348): reads that
    took one page for the whole answer were "silently returning a fraction of the matching
    records". The Lightup client returned ``data`` as the whole list and ignored
    ``metadata.total``: with 5 incidents updated since the cursor and 2 sent, the sensor took the 2
    for all of them, and its cursor could move past the other 3. Right answer (the server's own total): the list is
    refused as incomplete (the sensor then keeps its cursor: "Lightup not reachable; cursor
    kept"); a complete answer is returned whole."""
    stored = list(range(5))
    with serve(_lightup(stored, cap=2)) as (url, _):
        with LightupClient(LightupCredential(server=url, refresh="r"), policy=FAST) as c:
            with pytest.raises(HttpApiError, match=r"2 of 5 items \(metadata.total\)"):
                c.list_incidents(start_updated_ts=0)
    with serve(_lightup(stored, cap=10)) as (url, _):
        with LightupClient(LightupCredential(server=url, refresh="r"), policy=FAST) as c:
            assert [i["uuid"] for i in c.list_incidents(start_updated_ts=0)] == [f"inc-{i}" for i in stored]
