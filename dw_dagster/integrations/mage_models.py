"""Mage's pipeline runs, block runs, pipelines, triggers and log summaries as pydantic models.

Field names are Mage's (mage-ai 0.9.80 presenters: ``PipelineRunPresenter``, ``BlockRunPresenter``,
``PipelinePresenter``, ``PipelineSchedulePresenter``, ``StatusPresenter``; statuses from
``mage_ai/orchestration/db/models/schedules.py``). Unknown fields are ignored; timestamps become
timezone-aware UTC (Mage writes UTC and presents it without an offset, ``"2026-12-02 04:57:16"``).
Read by :class:`dw_dagster.integrations.mage.MageClient`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

#: Pipeline run statuses (``PipelineRun.PipelineRunStatus``, ``mage_ai/orchestration/db/models/schedules.py``).
RUN_STATUSES = ("initial", "running", "completed", "failed", "cancelled")
RUN_FINISHED = frozenset({"completed", "failed", "cancelled"})
RUN_PROBLEMS = frozenset({"failed", "cancelled"})
#: Block run statuses (``BlockRun.BlockRunStatus``).
BLOCK_RUN_STATUSES = ("initial", "queued", "running", "completed", "failed", "cancelled", "upstream_failed",
                      "condition_failed")
_ERROR_LEVELS = frozenset({"ERROR", "EXCEPTION", "CRITICAL"})


def utc_time(value: Any) -> dt.datetime | None:
    """A Mage timestamp as aware UTC.

    Args:
        value: ``"2026-12-02 04:57:16[.ffffff][+00:00]"`` (run and trigger fields), ISO 8601 with a
            ``T`` (the block-run list), epoch seconds, or a datetime; naive values are UTC (as Mage
            writes them, and as ``Incident.window_start``/``window_end`` are).

    Returns:
        The instant with ``tzinfo=UTC``, or None for None or ``""``.

    Raises:
        ValueError: a string that is not an ISO 8601 timestamp.
    """
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    parsed = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return parsed.replace(tzinfo=dt.timezone.utc) if parsed.tzinfo is None else parsed.astimezone(dt.timezone.utc)


UtcTime = Annotated[dt.datetime | None, BeforeValidator(utc_time)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MageStatus(_Model):
    """``GET /api/status`` (``StatusPresenter``): the instance and its scheduler."""

    repo_path: str | None = None
    require_user_authentication: bool | None = None
    scheduler_status: str | None = None  # "running" | "stopped"
    project_type: str | None = None
    project_uuid: str | None = None


class MageBlock(_Model):
    """A block of a pipeline (``{"pipeline": {"blocks": [...]}}``)."""

    uuid: str
    name: str | None = None
    type: str | None = None  # data_loader | transformer | data_exporter | ...
    language: str | None = None
    upstream_blocks: tuple[str, ...] = ()
    downstream_blocks: tuple[str, ...] = ()


class MagePipeline(_Model):
    """A pipeline (``PipelinePresenter``): ``type`` is python (batch), streaming, integration, ..."""

    uuid: str
    name: str | None = None
    type: str | None = None
    description: str | None = None
    tags: tuple[str, ...] = ()
    blocks: tuple[MageBlock, ...] = ()


class MageTrigger(_Model):
    """A trigger (``pipeline_schedule``; ``PipelineSchedulePresenter``). The API trigger's token is not kept."""

    id: int
    name: str
    pipeline_uuid: str
    schedule_type: str | None = None  # api | time | event
    status: str | None = None  # active | inactive
    schedule_interval: str | None = None
    last_pipeline_run_status: str | None = None
    pipeline_runs_count: int | None = None


class MageBlockRun(_Model):
    """One block's run inside a pipeline run (``BlockRunPresenter``).

    Attributes:
        status: one of :data:`BLOCK_RUN_STATUSES`.
        error: the failure's message (``metrics.error.error``, present in a run's nested block runs),
            else None.
    """

    id: int
    pipeline_run_id: int
    block_uuid: str
    status: str
    created_at: UtcTime = None
    started_at: UtcTime = None
    completed_at: UtcTime = None
    updated_at: UtcTime = None
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _error_from_metrics(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "error" not in data:
            err = (data.get("metrics") or {}).get("error") if isinstance(data.get("metrics"), Mapping) else None
            message = err.get("error") if isinstance(err, Mapping) else None
            if message:
                return {**data, "error": str(message)[:500]}
        return data


class MageRun(_Model):
    """A pipeline run (``PipelineRunPresenter``; the list form adds block runs and the trigger's name/type).

    Run ``variables`` are not kept (they may hold secrets); only ``execution_partition``, which
    names the run's log folder. Mage leaves ``completed_at`` empty on a failed or cancelled run:
    :attr:`ended_at` then falls back to ``updated_at``.
    """

    id: int
    pipeline_uuid: str
    status: str
    pipeline_schedule_id: int | None = None
    pipeline_schedule_name: str | None = None
    pipeline_schedule_type: str | None = None
    execution_date: UtcTime = None
    created_at: UtcTime = None
    started_at: UtcTime = None
    completed_at: UtcTime = None
    updated_at: UtcTime = None
    backfill_id: int | None = None
    execution_partition: str | None = None
    block_runs: tuple[MageBlockRun, ...] = ()
    block_runs_count: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _partition(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "execution_partition" not in data:
            variables = data.get("variables")
            if isinstance(variables, Mapping) and variables.get("execution_partition"):
                return {**data, "execution_partition": str(variables["execution_partition"])}
        return data

    @property
    def finished(self) -> bool:
        """Completed, failed or cancelled."""
        return self.status in RUN_FINISHED

    @property
    def began_at(self) -> dt.datetime | None:
        """When it started, or when it was created while it waits for the scheduler."""
        return self.started_at or self.created_at

    @property
    def ended_at(self) -> dt.datetime | None:
        """When it finished (``completed_at``, else ``updated_at`` once finished); None while in progress."""
        return self.completed_at or (self.updated_at if self.finished else None)

    @property
    def failed_blocks(self) -> tuple[MageBlockRun, ...]:
        """Its block runs that failed, were cancelled or whose upstream failed."""
        return tuple(b for b in self.block_runs if b.status in ("failed", "cancelled", "upstream_failed"))


class MageLogFile(_Model):
    """What one log file of a run says: lines and how many are errors or warnings, and the last error."""

    name: str
    lines: int
    errors: int
    warnings: int
    last_error: str | None = None


class MageLogSummary(_Model):
    """A run's logs, summarised (``GET /api/pipelines/{uuid}/logs?pipeline_run_id[]=``)."""

    pipeline_uuid: str
    run_id: int
    files: tuple[MageLogFile, ...] = ()

    @property
    def errors(self) -> int:
        return sum(f.errors for f in self.files)

    @property
    def last_error(self) -> str | None:
        """The last error message in the block logs, else in the pipeline's own logs."""
        for f in sorted(self.files, key=lambda f: f.name in ("pipeline.log", "scheduler.log")):
            if f.last_error:
                return f.last_error
        return None


def summarize_log(name: str, content: str) -> MageLogFile:
    """Count a Mage log file's entries (``<time> {"level", "message", "error"?}`` lines) by level.

    Lines that are not JSON (a traceback printed after its entry) are counted but not classified.
    ``last_error`` is the last line of the last ERROR/EXCEPTION/CRITICAL entry's ``error`` (the
    exception, e.g. ``ValueError: ...``), else its ``message``.
    """
    lines = errors = warnings = 0
    last: str | None = None
    for line in content.splitlines():
        if not line.strip():
            continue
        lines += 1
        _, _, rest = line.partition(" ")
        try:
            entry = json.loads(rest)
        except ValueError:
            continue
        level = str(entry.get("level", "")).upper() if isinstance(entry, dict) else ""
        if level in _ERROR_LEVELS:
            errors += 1
            err = str(entry.get("error") or "").strip().splitlines()
            last = (err[-1] if err else str(entry.get("message") or "")).strip()[:500] or last
        elif level == "WARNING":
            warnings += 1
    return MageLogFile(name=name, lines=lines, errors=errors, warnings=warnings, last_error=last)
