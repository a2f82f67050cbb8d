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
from dw_dagster.core.dagster_private import public


def record_proposal(instance: dg.DagsterInstance | Ledger, cs: ChangeSet) -> tuple[ChangeSet, bool]:
    """Record a proposed change set in the ledger; returns (the recorded change set, whether it is new).

    The same content proposed again (a re-executed diagnosis run) returns the first record, with
    its original expiry.

    Raises:
        TamperedRecord: ``cs`` does not hash to its version (build it with :meth:`ChangeSet.seal`).
    """
    cs.verify_version()
    led = instance if isinstance(instance, Ledger) else ledger_for(instance)
    row, new = led.record_change_set(
        change_set_id=cs.id, version=cs.version, content_key=cs.content_key(), target_asset=asset_str(cs.target_asset),
        incident_id=cs.incident_id, domain=cs.domain, expires_at=cs.expires_at.timestamp(), body=cs.model_dump_json())
    return (cs if new else parse_change_set(row.body)), new


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


__all__ = ["change_set_observation", "load_change_set", "parse_change_set", "propose", "record_proposal"]
