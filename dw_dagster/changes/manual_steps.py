"""Manual steps of a change set: what the engineer does outside dw_dagster, named with how and where.

dw_dagster changes nothing inside Mage. When a pipeline that reads the repaired table downstream
runs in Mage, the change set names its rerun for the engineer, after the data steps:

    rerun `finance_daily` in Mage after steps 1–2 (migration-1, replay-2)

with the ``mage-agent`` MCP call that starts it (``run_pipeline``) and the pipeline's page in
Mage's UI. The verify stage's ``mage_rerun`` check
(:func:`dw_dagster.repair.mage_rerun.build_mage_rerun_check`) waits, bounded, for a run of that
pipeline started after the last data step and records its outcome in the receipt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from dw_dagster.core import keys as c
from dw_dagster.core.models import ChangeSet, ManualStep

MAGE_RERUN = "mage_rerun"
#: the verification check that waits for the Mage reruns of a change set (on the repaired asset)
MAGE_RERUN_CHECK = c.MAGE_RERUN_CHECK


def _steps_words(after: Sequence[str]) -> str:
    if not after:
        return "once the change set's data changes are applied"
    n = len(after)
    nums = "step 1" if n == 1 else f"steps 1–{n}"
    return f"after {nums} ({', '.join(after)})"


def mage_agent_call(pipeline: str) -> str:
    """The ``mage-agent`` call that runs ``pipeline``: its MCP tool ``run_pipeline`` (served by
    ``mage-agent mcp``) with its arguments, e.g. ``mage-agent run_pipeline {"pipeline_uuid": "finance_daily"}``."""
    return f"mage-agent run_pipeline {json.dumps({'pipeline_uuid': pipeline})}"


def mage_rerun_step(pipeline: str, after: Sequence[str], *, ui_url: str | None = None,
                    check: Sequence[str] = ()) -> ManualStep:
    """The manual step "rerun ``pipeline`` in Mage after steps 1–n".

    Args:
        pipeline: the Mage pipeline's uuid (e.g. ``finance_daily``).
        after: the data stages it must follow, in order (``["migration-1", "replay-2"]``).
        ui_url: the base URL of Mage's UI (the step links the pipeline's triggers page), or None.
        check: ``[*asset key, check name]`` of the verification check that waits for it.

    Returns:
        A :class:`~dw_dagster.core.models.ManualStep` of kind ``mage_rerun``.
    """
    url = f"{ui_url.rstrip('/')}/pipelines/{pipeline}/triggers" if ui_url else None
    return ManualStep(
        kind=MAGE_RERUN, system="mage", target=pipeline, after=list(after),
        summary=f"rerun `{pipeline}` in Mage {_steps_words(after)}: it read the table while rows were missing "
                "(dw_dagster starts nothing in Mage; its verify stage waits for this run)",
        command=mage_agent_call(pipeline),
        url=url, check=list(check))


def mage_reruns(cs: ChangeSet | None) -> list[ManualStep]:
    """The change set's Mage reruns (empty for None)."""
    return [s for s in (cs.manual_steps if cs else []) if s.kind == MAGE_RERUN]


def manual_steps_markdown(cs: ChangeSet) -> str:
    """The change set's manual steps as markdown (empty when it has none)."""
    if not cs.manual_steps:
        return ""
    lines = ["### For the engineer (outside dw_dagster)"]
    for i, s in enumerate(cs.manual_steps, 1):
        lines += [f"{i}. {s.summary}", f"   - call: `{s.command}`"]
        if s.url:
            lines.append(f"   - UI: {s.url}")
        if s.check:
            lines.append(f"   - verified by `{s.check[-1]}` on {'/'.join(s.check[:-1])}")
    return "\n".join(lines)


__all__ = ["MAGE_RERUN", "MAGE_RERUN_CHECK", "mage_agent_call", "mage_rerun_step", "mage_reruns", "manual_steps_markdown"]
