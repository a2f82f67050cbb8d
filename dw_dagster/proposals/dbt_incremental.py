"""The fix for late rows behind a dbt incremental model's high-watermark: a diff of the model, a bounded rebuild.

The diff rewrites the model's ``is_incremental()`` filter (:mod:`dw_dagster.pipelines.dbt_incremental`)
so that it reads by the arrival column when the model has it (else the same column) with a lookback
covering the longest delay the diagnosis measured, and adds a bounded-rebuild clause::

    {% if is_incremental() %}
    where (
        posted_ts > (SELECT MAX(posted_ts) - INTERVAL '48' HOUR FROM {{ this }})
        {%- if var('dw_window_start', none) is not none %}
        or (sale_ts >= CAST('{{ var("dw_window_start") }}' AS TIMESTAMP) AND sale_ts < CAST('{{ var("dw_window_end") }}' AS TIMESTAMP))
        {%- endif %}
    )
    {% endif %}

The clause reads nothing on an ordinary run; with the two dbt vars set it re-reads the source rows
of that window, which the model's ``unique_key`` merges without duplicates (the diff adds
``unique_key`` when the model has none). The repair is a ``dbt_window`` step
(:mod:`dw_dagster.repair.dbt_window`): ``dbt build --select <model> --vars
'{"dw_window_start": ..., "dw_window_end": ...}'`` once per contiguous range of the days holding
late rows, never ``--full-refresh`` (a full refresh rebuilds every row of the model and cannot be
bounded or undone by window). The SQL is built with sqlglot in the warehouse's dialect; only the
Jinja around it (``{{ this }}``, ``var()``) is text.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from pathlib import Path

from sqlglot import exp

from dw_dagster.core import keys as c
from dw_dagster.core.domains import PIPELINE_CODE, REBUILD_MODELS, RERUN_WINDOW, Domain
from dw_dagster.core.models import CauseFinding, ChangeSet, ChangeStep, Diagnosis, FileChange, Incident, UndoPlan
from dw_dagster.core.models import stable_hash, utcnow
from dw_dagster.databases import sql
from dw_dagster.pipelines.dbt_incremental import (
    THIS, WINDOW_END_VAR, WINDOW_START_VAR, DbtIncrementalError, DbtIncrementalModel, parse_block, render_block,
    watermark_comparisons, read_incremental_filter)
from dw_dagster.proposals.watermark import ProposalError, _sha, unified_diff

DBT_WINDOW = "dbt_window"

#: strategies that replace a re-read row by its unique_key instead of appending it again
MERGING_STRATEGIES = (None, "default", "merge", "delete+insert")

_START, _END = "__dw_window_start__", "__dw_window_end__"


def _jinja(sql_text: str) -> str:
    """Generated SQL back into the model's Jinja: the placeholder relation and the window vars."""
    out = re.sub(rf'"?{THIS}"?', "{{ this }}", sql_text)
    return (out.replace(f"'{_START}'", f"'{{{{ var(\"{WINDOW_START_VAR}\") }}}}'")
               .replace(f"'{_END}'", f"'{{{{ var(\"{WINDOW_END_VAR}\") }}}}'"))


def rewrite_incremental_model(text: str, dialect: str, *, column: str, lookback_hours: float, window_column: str,
                              unique_key: str | None = None) -> str:
    """The model's SQL with its high-watermark comparison on ``column`` less ``lookback_hours`` and the
    bounded-rebuild clause on ``window_column`` (module docstring).

    Args:
        text: the model's SQL file as it is.
        dialect: the warehouse's sqlglot dialect.
        column: the column to compare with ``max(column)`` of ``{{ this }}``.
        lookback_hours: hours subtracted from that max (whole hours; 0 for none).
        window_column: the column whose ``[dw_window_start, dw_window_end)`` a bounded rebuild re-reads.
        unique_key: a key to add to the model's ``config()`` (when it has none).

    Returns:
        The new SQL text; everything outside the ``is_incremental()`` block is kept as written.

    Raises:
        DbtIncrementalError: the filter cannot be read (:func:`~dw_dagster.pipelines.dbt_incremental.read_incremental_filter`).
        ProposalError: the lookback is not a whole number of hours.
    """
    if lookback_hours != int(lookback_hours) or lookback_hours < 0:
        raise ProposalError(f"lookback {lookback_hours} h is not a whole number of hours")
    block = read_incremental_filter(text, dialect).block
    rendered = render_block(block.text, None)
    lead = rendered.strip().split(None, 1)[0].lower()
    condition = parse_block(rendered, dialect)
    node = watermark_comparisons(condition)[0][0]
    value = node.expression.this.expressions[0].unalias()
    base = value.this if isinstance(value, exp.Sub) and isinstance(value.expression, exp.Interval) else value
    base = base.copy().transform(lambda n: exp.Max(this=sql.column(column)) if isinstance(n, exp.Max) else n)
    if lookback_hours:
        base = exp.Sub(this=base, expression=exp.Interval(this=exp.Literal.string(str(int(lookback_hours))),
                                                          unit=exp.Var(this="HOUR")))
    new = type(node)(this=sql.column(column), expression=exp.Subquery(
        this=exp.select(base).from_(exp.to_table(THIS))))
    if node is condition:
        condition = new
    else:
        node.replace(new)
    if lead == "and":  # the block continued the model's own WHERE: drop the TRUE it was parsed after
        parts = [p for p in condition.flatten() if not (isinstance(p, exp.Boolean) and p.this is True)] \
            if isinstance(condition, exp.And) else [condition]
        condition = exp.and_(*parts) if len(parts) > 1 else parts[0]
    win = sql.column(window_column)
    ts = exp.DataType.build("TIMESTAMP")
    window = exp.and_(exp.GTE(this=win, expression=exp.cast(exp.Literal.string(_START), ts)),
                      exp.LT(this=win.copy(), expression=exp.cast(exp.Literal.string(_END), ts)))
    inner = (f"\n{lead} (\n    {_jinja(condition.sql(dialect=dialect))}\n"
             f"    {{%- if var('{WINDOW_START_VAR}', none) is not none %}}\n"
             f"    or ({_jinja(window.sql(dialect=dialect))})\n"
             f"    {{%- endif %}}\n)\n")
    out = text[:block.start] + inner + text[block.end:]
    if unique_key is not None:
        sql.check_name(unique_key, "unique_key")
        config = re.search(r"\{\{-?\s*config\s*\(", out)
        out = (out[:config.end()] + f"unique_key='{unique_key}', " + out[config.end():] if config
               else f"{{{{ config(unique_key='{unique_key}') }}}}\n" + out)
    return out


def window_ranges(days: Sequence[str]) -> list[tuple[dt.datetime, dt.datetime]]:
    """Contiguous ``[start, end)`` ranges (naive UTC midnights) covering the ISO ``days``."""
    out: list[list[dt.datetime]] = []
    for d in sorted({dt.date.fromisoformat(k) for k in days}):
        start = dt.datetime.combine(d, dt.time())
        if out and out[-1][1] == start:
            out[-1][1] = start + dt.timedelta(days=1)
        else:
            out.append([start, start + dt.timedelta(days=1)])
    return [(a, b) for a, b in out]


def window_vars(start: dt.datetime, end: dt.datetime) -> str:
    """The ``--vars`` of one bounded rebuild, as JSON."""
    return json.dumps({WINDOW_START_VAR: start.isoformat(sep=" "), WINDOW_END_VAR: end.isoformat(sep=" ")})


def propose_dbt_incremental_fix(
    *,
    incident: Incident,
    diagnosis: Diagnosis,
    finding: CauseFinding,
    domain: Domain,
    repo_root: str | Path,
    project_dir: str | Path,
    model: DbtIncrementalModel,
    dialect: str,
    key_column: str | None,
    arrival_in_model: bool,
    target_resource_key: str,
    target_table: str,
    source_table: str,
    rebuild_assets: Sequence[Sequence[str]],
    verify_checks: Sequence[Sequence[str]],
    proposer: str = c.PROPOSER,
    now: dt.datetime | None = None,
) -> ChangeSet:
    """One change set for a ``late_rows_behind_watermark`` finding on a dbt incremental model.

    Args:
        incident, diagnosis, finding: what was found; ``finding.window`` holds the days (of the
            watermark column) with late rows, ``finding.details`` the watermark and arrival columns
            and the proposed lookback in hours.
        domain: the owning domain (approvers, the cap on the window's days, expiry).
        repo_root: the git working copy the diff applies to (holding the dbt project).
        project_dir: the dbt project directory, inside ``repo_root``.
        model: the model, from the manifest.
        dialect: the warehouse's sqlglot dialect.
        key_column: the key the model merges on; added as ``unique_key`` when the model has none.
        arrival_in_model: the arrival column is a column of the model's table (then the filter
            reads by it; else the lookback is put on the watermark column).
        target_resource_key, target_table: the warehouse resource and the model's table (undo).
        source_table: the table the model's watermark follows (recorded by the rebuild).
        rebuild_assets: the models downstream of it, rebuilt after the window.
        verify_checks: ``[*asset key path, check name]`` of the checks that prove the repair.

    Raises:
        ProposalError: no window, a window over the domain's cap, a strategy that appends
            (``append``, ``insert_overwrite``, ``microbatch``: a re-read would duplicate or replace
            more than the window), no key to merge on, the model file missing, or a bounded-rebuild
            clause already on another column.
    """
    now = now or utcnow()
    days = sorted(set(finding.window))
    if not days:
        raise ProposalError("the finding names no day to rebuild")
    if len(days) > domain.max_window_partitions:
        raise ProposalError(f"window of {len(days)} days exceeds domain {domain.name!r} cap of {domain.max_window_partitions}")
    if model.incremental_strategy not in MERGING_STRATEGIES:
        raise ProposalError(f"model {model.name} uses incremental_strategy {model.incremental_strategy!r}, which does not "
                            "merge on unique_key: re-reading a window would duplicate rows; use merge or delete+insert")
    if model.unique_key is None and key_column is None:
        raise ProposalError(f"model {model.name} has no unique_key and no key is configured to add")
    root, project = Path(repo_root).resolve(), Path(project_dir).resolve()
    path = project / model.file
    if not path.exists():
        raise ProposalError(f"model file not found: {path}")
    rel = path.relative_to(root).as_posix()
    before = path.read_text()
    try:
        filt = read_incremental_filter(before, dialect)
    except DbtIncrementalError as e:
        raise ProposalError(str(e)) from e
    window_column = finding.details["watermark_column"]
    if filt.window_column not in (None, window_column):
        raise ProposalError(f"model {model.name} already re-reads windows of {filt.window_column}; the late rows are "
                            f"measured by day of {window_column}")
    arrival = finding.details["arrival_column"]
    column = arrival if arrival_in_model else filt.watermark_column
    lookback = max(float(finding.details["proposed_lookback_hours"]), filt.lookback_hours)
    after = rewrite_incremental_model(before, dialect, column=column, lookback_hours=lookback, window_column=window_column,
                                      unique_key=key_column if model.unique_key is None else None)
    ranges = window_ranges(days)
    commands = [f"dbt build --select {model.name} --vars '{window_vars(a, b)}'" for a, b in ranges]
    step = ChangeStep(
        kind=DBT_WINDOW, change_class=RERUN_WINDOW, resource_key=target_resource_key,
        summary=f"rebuild {model.name} over {days[0]}..{days[-1]} ({len(days)} day(s) of {window_column}) with "
                f"{len(ranges)} bounded dbt build(s), merging on its unique_key",
        spec={"model": model.name, "unique_id": model.unique_id, "model_file": model.file, "window_column": window_column,
              "days": days, "ranges": [[a.isoformat(sep=" "), b.isoformat(sep=" ")] for a, b in ranges],
              "arrival_column": arrival, "source_table": source_table},
        sql=commands)
    diff = unified_diff({rel: (before, after)})
    provisional_id = "cs-" + stable_hash([incident.id, days, after], 10)
    was = f"{filt.watermark_column} {filt.operator} max" + (f" - {filt.lookback_hours:g} h" if filt.lookback_hours else "")
    content = dict(
        id=provisional_id, incident_id=incident.id, diagnosis_id=diagnosis.id, domain=domain.name, proposer=proposer,
        created_at=now, expires_at=now + dt.timedelta(hours=domain.approval_expiry_hours),
        approvers=list(domain.approvers), cause_kind=finding.kind,
        summary=(f"Read dbt model {model.name} by {column} with a {lookback:g} h lookback (was {was}), rebuild it over "
                 f"{days[0]}..{days[-1]} with `dbt build --select {model.name} --vars` to recover {finding.explained_rows} "
                 f"rows, rebuild {len(rebuild_assets)} downstream model(s)"),
        target_asset=list(incident.asset_key), window=[], diff=diff,
        files=[FileChange(path=rel, before_sha256=_sha(before), after_sha256=_sha(after))],
        rebuild_assets=[list(k) for k in rebuild_assets], new_tests=[], verify_checks=[list(k) for k in verify_checks],
        expected_recovered_rows=finding.explained_rows,
        undo_plan=UndoPlan(resource_key=target_resource_key, table=target_table, partition_column=window_column,
                           window=days),
        change_classes=[PIPELINE_CODE, RERUN_WINDOW] + ([REBUILD_MODELS] if rebuild_assets else []),
        steps=[step],
        undo=(f"Revert the model with `git apply -R -p1` of this diff. The rebuild merged the source's own rows of "
              f"{days[0]}..{days[-1]} on the unique_key; `dw-dagster undo` restores those days of {target_table} "
              "from the snapshot kept before it."),
    )
    return ChangeSet.seal(**content)


__all__ = ["DBT_WINDOW", "MERGING_STRATEGIES", "propose_dbt_incremental_fix", "rewrite_incremental_model",
           "window_ranges", "window_vars"]
