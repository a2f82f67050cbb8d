"""The attribution a generated workload should get, computed here on its own (plain Python loops over
the generated rows), so the tests never compare the report's SQL with itself."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field

from dw_dagster_dev.cost_workload import Workload


@dataclass
class Expected:
    metered: float = 0.0
    per_query: dict[str, float] = field(default_factory=dict)
    idle_by_warehouse: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_model: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_asset: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_run: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_partition: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    untagged: float = 0.0
    cs_billed_not_in_queries: float = 0.0
    compute_not_in_hours: float = 0.0
    cs_ratio: dict[dt.date, float] = field(default_factory=dict)


def expected(wl: Workload, since: dt.date, until: dt.date, node_assets: dict[str, str] | None = None) -> Expected:
    start, end = dt.datetime.combine(since, dt.time()), dt.datetime.combine(until, dt.time())
    e = Expected()
    queries = {q.query_id: q for q in wl.queries}
    compute = defaultdict(float)
    hourly_total = 0.0
    for h_start, h_end, _wid, wh, _used, credits, _cs in wl.hourly:
        if not (start <= h_start < end) or not credits:
            continue
        hourly_total += credits
        ms = {}
        for q in wl.queries:
            if q.warehouse != wh:
                continue
            lo, hi = max(q.exec_start, h_start), min(q.end, h_end)
            if hi > lo:
                ms[q.query_id] = (hi - lo) / dt.timedelta(milliseconds=1)
        total = sum(ms.values())
        if total <= 0:
            e.idle_by_warehouse[wh] += credits
            continue
        for qid, x in ms.items():
            compute[qid] += credits * x / total
    daily_compute = cs_used_total = cs_adj_total = 0.0
    for _st, day, comp, cs_used, _u, adj, billed in wl.daily:
        if since <= day < until:
            e.metered += billed
            daily_compute += comp
            cs_used_total += cs_used
            cs_adj_total += adj
            e.cs_ratio[day] = (cs_used + adj) / cs_used if cs_used > 0 else 0.0
    cs_in_queries = 0.0
    for qid, q in queries.items():
        if q.end <= start or q.start >= end:
            continue
        cs = round(q.cs_credits, 9) * e.cs_ratio.get(q.start.date(), 0.0) if q.start >= start else 0.0
        cs_in_queries += cs
        credits = compute.get(qid, 0.0) + cs
        e.per_query[qid] = credits
        kind = q.truth[0]
        if kind in ("model", "test"):
            e.by_model[q.truth[1]] += credits
            if node_assets and q.truth[1] in node_assets:
                e.by_asset[node_assets[q.truth[1]]] += credits
        elif kind == "asset":
            e.by_run[q.truth[1]] += credits
            e.by_asset[q.truth[2]] += credits
            e.by_partition[(q.truth[2], q.truth[3])] += credits
        else:
            e.untagged += credits
    e.cs_billed_not_in_queries = cs_used_total + cs_adj_total - cs_in_queries
    e.compute_not_in_hours = daily_compute - hourly_total
    return e
