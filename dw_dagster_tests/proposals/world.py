"""What a proposal is made from: an incident, its diagnosis, a late-rows finding and the owning domain.

Not a test module; the proposal tests import it.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

from dw_dagster.core.domains import Domain
from dw_dagster.core.models import BlastRadius, CauseFinding, Diagnosis, Incident

NOW = dt.datetime(2026, 11, 6, 9, 0, tzinfo=dt.timezone.utc)
OWNER = "owner@example.com"


def incident(asset=("pos", "sales_line")) -> Incident:
    return Incident(id="inc-1", asset_key=list(asset), source="dw_check", check_name="reconcile", detected_at=NOW,
                    summary="2,124 rows short", gap_rows=2124, gap_pct=1.8)


def diagnosis(inc: Incident) -> Diagnosis:
    return Diagnosis(id="dg-1", incident_id=inc.id, asset_key=inc.asset_key, created_at=NOW, causes=[],
                     blast_radius=BlastRadius(root="sales_line"), gap_rows=inc.gap_rows, unexplained_rows=0)


def late_rows(window: list[str], *, watermark="sale_ts", arrival="posted_ts", lookback=48, rows=2124,
              per_partition: list[dict] | None = None) -> CauseFinding:
    return CauseFinding(kind="late_rows_behind_watermark", summary="rows landed behind the watermark", confidence=1.0,
                        explained_rows=rows, unexplained_rows=0, window=window,
                        details={"watermark_column": watermark, "arrival_column": arrival,
                                 "proposed_lookback_hours": lookback, "per_partition": per_partition or []})


def domain(cap: int = 7) -> Domain:
    return Domain(name="pos", assets=[["pos", "sales_line"]], approvers=[OWNER], max_window_partitions=cap, approval_expiry_hours=24)


def git_repo(root: Path, files: dict[str, str]) -> Path:
    """A git working copy at ``root`` holding ``files``, committed."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root
