"""Combine the findings of several causes into one explained total and an honest remainder.

Two causes can explain the same missing row (a back-dated row that also has a NULL), so their
``explained_rows`` cannot simply be added. :func:`combine_findings` counts each row once when
the findings say enough to do so, and otherwise never claims more than the gap:

1. **keys** — every counting finding lists its explained keys completely
   (``details["explained_keys"]`` with ``details["explained_keys_complete"]``): the union is counted.
2. **partitions** — every counting finding gives per-partition counts
   (``details["per_partition"]``: ``partition``, ``explained_rows``, optional ``gap_rows``): per
   partition the sum is capped at that partition's gap (the largest gap any finding measured
   there), then the total at the incident's gap.
3. **capped sum** — otherwise the sum, capped at the gap.

``explained_rows_lower_bound`` is the largest single finding (what is explained for sure if the
findings overlapped completely). Only findings that point the gap's way count: a short target
(gap > 0) is explained by missing-row causes, a long one (gap < 0) by surplus causes
(``details["direction"] == "surplus"``, e.g. a duplicate load). What no cause explains is
reported as a finding of kind ``unexplained`` with its size — never put on the nearest cause.
"""

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from dw_dagster.core.models import CauseFinding
from dw_dagster.dagster_private import public

UNEXPLAINED_KIND = "unexplained"


class CombinedFindings(BaseModel):
    """The combined result. Rows are counted in the gap's direction (``abs(gap_rows)``)."""

    gap_rows: int
    explained_rows: int
    explained_rows_lower_bound: int
    unexplained_rows: int
    method: Literal["none", "single", "keys", "partitions", "capped_sum"]
    counted_kinds: list[str]
    findings: list[CauseFinding]


def _surplus(f: CauseFinding) -> bool:
    return f.details.get("direction") == "surplus"


def unexplained_finding(rows: int, gap_rows: int, tested: Sequence[str] = ()) -> CauseFinding:
    """A finding of kind ``unexplained`` for ``rows`` of the gap that no tested cause explains."""
    kinds = ", ".join(sorted(set(tested))) or "none"
    return CauseFinding(
        kind=UNEXPLAINED_KIND,
        summary=f"{rows} of {abs(gap_rows)} row(s) of the gap are not explained by any cause tested ({kinds}); "
                "reported as unexplained, not assigned to the nearest cause.",
        confidence=0.0, explained_rows=0, unexplained_rows=rows,
        details={"gap_rows": gap_rows, "causes_tested": sorted(set(tested))},
    )


@public
def combine_findings(gap_rows: int, findings: Sequence[CauseFinding]) -> CombinedFindings:
    """Total explained rows without double counting, and the unexplained remainder (module docstring).

    Args:
        gap_rows: the incident's gap, source − target rows (negative when the target has more).
        findings: one finding per cause tested, in any order.

    Returns:
        :class:`CombinedFindings`; ``findings`` is ordered by explained rows, then confidence
        (both descending), with an ``unexplained`` finding last when a remainder is left.
    """
    gap = abs(gap_rows)
    counting = [f for f in findings if f.explained_rows > 0 and f.kind != UNEXPLAINED_KIND
                and gap_rows != 0 and _surplus(f) == (gap_rows < 0)]
    lower = min(gap, max((f.explained_rows for f in counting), default=0))
    if not counting:
        method, explained = "none", 0
    elif len(counting) == 1:
        method, explained = "single", min(gap, counting[0].explained_rows)
    elif all(f.details.get("explained_keys_complete") and isinstance(f.details.get("explained_keys"), list) for f in counting):
        union = {tuple(None if v is None else str(v) for v in k) for f in counting for k in f.details["explained_keys"]}
        method, explained = "keys", min(gap, len(union))
    elif all(f.details.get("per_partition") for f in counting):
        sums: dict[str, int] = {}
        caps: dict[str, int] = {}
        for f in counting:
            for p in f.details["per_partition"]:
                key = str(p.get("partition"))
                sums[key] = sums.get(key, 0) + int(p.get("explained_rows") or 0)
                if p.get("gap_rows") is not None:
                    caps[key] = max(caps.get(key, 0), abs(int(p["gap_rows"])))
        method = "partitions"
        explained = min(gap, sum(min(v, caps[k]) if k in caps else v for k, v in sums.items()))
    else:
        method, explained = "capped_sum", min(gap, sum(f.explained_rows for f in counting))
    explained = max(explained, lower)
    unexplained = gap - explained
    ordered = sorted([f for f in findings if f.kind != UNEXPLAINED_KIND], key=lambda f: (-f.explained_rows, -f.confidence))
    if unexplained > 0:
        ordered.append(unexplained_finding(unexplained, gap_rows, [f.kind for f in ordered]))
    return CombinedFindings(gap_rows=gap_rows, explained_rows=explained, explained_rows_lower_bound=lower,
                            unexplained_rows=unexplained, method=method, counted_kinds=[f.kind for f in counting],
                            findings=ordered)
