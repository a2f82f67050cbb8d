"""Field cases of the Mage client's paged reads (:meth:`~dw_dagster.integrations.mage.MageClient.pipeline_runs`,
what the diagnosis's Mage evidence and the rerun wait read), against a real loopback server that
pages as Mage does (``_limit``/``_offset``, ``metadata {count, next}``) and whose list changes
between two page requests."""

import pytest

from dw_dagster.core.http import RetryPolicy
from dw_dagster.integrations.mage import MageApiError, MageClient
from dw_dagster_tests.field_cases.kinds import kind
from dw_dagster_tests.field_cases.loopback import serve

KINDS = [
    kind("mage-offset-shift-on-delete", "vendors", "runs deleted between two page requests of an offset-paged list "
         "(Mage's retention): the next page skips a run", "https://github.com/taskcluster/taskcluster/issues/3278",
         "dw_dagster/integrations/mage.py", "test_a_run_deleted_while_paging_never_hides_another", True),
]

FAST = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=0.05, timeout_s=5.0)


def _run(i):
    return {"id": i, "pipeline_uuid": "finance_daily", "status": "completed", "created_at": f"2024-03-09 0{i}:00:00"}


def _mage(runs, on_page):
    """Answer ``GET /api/pipeline_runs`` from ``runs`` (id order), calling ``on_page(n)`` after the n-th page."""
    pages = [0]

    def answer(method, path, query, body):
        if path != "/api/pipeline_runs":
            return 404, {"error": {"code": 404, "message": "not found"}}
        limit, offset = int(query["_limit"]), int(query["_offset"])
        chunk = runs[offset:offset + limit]
        out = {"pipeline_runs": [_run(i) for i in chunk], "metadata": {"count": len(runs), "next": offset + limit < len(runs)}}
        pages[0] += 1
        on_page(pages[0])
        return 200, out

    return answer


def test_a_run_deleted_while_paging_never_hides_another():
    """taskcluster #3278 (https://github.com/taskcluster/taskcluster/issues/3278): with size/offset
    paging, "deletion of rows can cause rows to be skipped". Mage pages runs by ``_offset``; its
    retention deletes old runs. Run 1 deleted after the first page (runs 1, 2) moved run 3 to
    offset 1, so the page at offset 2 began with run 4: run 3 — here the failed run the diagnosis
    looks for — was never read, silently. Right answer (the server's own list once it settled):
    runs 2, 3, 4, 5; a list that keeps changing under every read is refused, never answered in part."""
    runs = [1, 2, 3, 4, 5]

    def delete_first_once(n):
        if n == 1:
            runs.remove(1)

    with serve(_mage(runs, delete_first_once)) as (url, seen):
        with MageClient(url, policy=FAST) as c:
            got = [r.id for r in c.pipeline_runs("finance_daily", page_size=2)]
    assert got == runs == [2, 3, 4, 5]

    churn = list(range(1, 40))
    with serve(_mage(churn, lambda n: churn.pop(0))) as (url, seen):
        with MageClient(url, policy=FAST) as c, pytest.raises(MageApiError, match="changed while it was read"):
            c.pipeline_runs("finance_daily", page_size=2)
