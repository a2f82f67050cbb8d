"""Change sets as the ledger holds them: record a proposal once, read a version back, show it.

A change set's version is the hash of its content (:meth:`dw_dagster.core.models.ChangeSet.seal`); the
ledger keeps every version once (:meth:`dw_dagster.core.ledger.Ledger.record_change_set`). Reading a
record back re-computes its hash: a record whose content was altered is refused as tampered.
"""

import dagster as dg

from dw_dagster.core.links import describe
from dw_dagster.core import keys as c
from dw_dagster.core.ledger import Ledger, asset_str, ledger_for
from dw_dagster.core.models import ChangeSet
from dw_dagster.core.records import load_change_set, parse_change_set
from dw_dagster.dagster_private import public


def record_proposal(instance: dg.DagsterInstance | Ledger, cs: ChangeSet) -> tuple[ChangeSet, bool]:
    """Record a proposed change set in the ledger; returns (the recorded change set, whether it is new).

    The same content proposed again (a re-executed diagnosis run) returns the first record, with
    its original expiry.

    Raises:
        TamperedRecord: ``cs`` does not hash to its version (build it with :meth:`ChangeSet.seal`).
    """
    cs.verify_version()
    led = instance if isinstance(instance, Ledger) else ledger_for(instance)
    cs = carry_merged_diff(led, cs)
    row, new = led.record_change_set(
        change_set_id=cs.id, version=cs.version, content_key=cs.content_key(), target_asset=asset_str(cs.target_asset),
        incident_id=cs.incident_id, domain=cs.domain, expires_at=cs.expires_at.timestamp(), body=cs.model_dump_json())
    return (cs if new else parse_change_set(row.body)), new


def versions_of(led: Ledger, cs: ChangeSet) -> list[tuple]:
    """``(row, change set)`` of every recorded version of ``cs.id``, oldest first (tampered ones left out)."""
    from dw_dagster.core.models import TamperedRecord

    out = []
    for row in reversed(led.change_set_rows(target_asset=asset_str(cs.target_asset), latest_only=False)):
        if row.change_set_id == cs.id and row.version != cs.version:
            try:
                out.append((row, parse_change_set(row.body)))
            except TamperedRecord:
                continue
    return out


def version_notes(led: Ledger, cs: ChangeSet) -> list[dict]:
    """The earlier versions of ``cs`` as a re-proposal records them: version, state, the ledger's note, the diff."""
    return [{"version": row.version, "state": row.state, "note": (row.note or "")[:500],
             "diff": "merged" if e.diff_merged_in else ("none" if not e.diff.strip() else f"{len(e.diff.splitlines())} lines"),
             "recorded_at": row.recorded_at} for row, e in versions_of(led, cs)]


def carry_merged_diff(led: Ledger, cs: ChangeSet) -> ChangeSet:
    """A version proposed again after its diff was merged (a retry after a failed stage: the proposal
    reads the merged files, so its own diff is empty) carries the original diff, marked merged with
    the version that proposed it, its new tests, a summary that says so, and the earlier versions.
    ``cs`` unchanged when it has a diff of its own or no earlier version had one."""
    if cs.diff.strip() or cs.diff_merged_in or cs.cause_kind == "undo":
        return cs
    earlier = versions_of(led, cs)
    prev = next((e for _, e in reversed(earlier) if e.diff.strip()), None)
    if prev is None:
        return cs
    mine = {f.path: f.after_sha256 for f in cs.files}
    if any(mine.get(f.path, f.after_sha256) != f.after_sha256 for f in prev.files):
        return cs  # the files moved on since: the earlier diff is not what is merged
    merged_in = prev.diff_merged_in or prev.version
    tests = "" if cs.new_tests or not prev.new_tests or "dbt test" in cs.summary else f", add {len(prev.new_tests)} dbt test(s)"
    content = {**cs.model_dump(exclude={"version"}), "diff": prev.diff, "files": list(prev.files),
               "new_tests": list(cs.new_tests or prev.new_tests), "diff_merged_in": merged_in,
               "summary": f"{cs.summary}{tests} (its code change was merged with version {merged_in[:12]}…, not again)",
               "earlier_versions": version_notes(led, cs)}
    return ChangeSet.seal(**content)


def change_set_observation(cs: ChangeSet) -> dg.AssetObservation:
    """The ``dw/change_set`` observation that shows a proposal on its target asset (with its markdown)."""
    from dw_dagster.proposals.watermark import change_set_markdown

    return dg.AssetObservation(asset_key=dg.AssetKey(cs.target_asset),
                               description=describe(f"change set {cs.id} proposed; waiting for approval by "
                                                    f"{', '.join(cs.approvers)}", change_set_id=cs.id),
                               metadata={c.CHANGE_SET_KEY: dg.MetadataValue.json(cs.model_dump(mode="json")),
                                         c.CHANGE_SET_MD_KEY: dg.MetadataValue.md(change_set_markdown(cs)),
                                         c.CHANGE_SET_ID_KEY: cs.id})


@public
def propose(instance: dg.DagsterInstance, cs: ChangeSet) -> tuple[ChangeSet, bool]:
    """Record a change set made outside a run (an undo from the CLI, a test) and show it on its asset.

    Returns:
        (the recorded change set, whether it is new); the same content proposed again keeps its first record.

    Raises:
        TamperedRecord: ``cs`` does not hash to its version.
    """
    recorded, new = record_proposal(instance, cs)
    if new:
        instance.report_runless_asset_event(change_set_observation(recorded))
    return recorded, new


__all__ = ["carry_merged_diff", "change_set_observation", "version_notes", "versions_of", "load_change_set", "parse_change_set", "propose", "record_proposal"]
