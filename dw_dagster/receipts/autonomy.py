"""Earned autonomy: each domain's record per change class, from the ledger and the receipts.

:func:`autonomy_records` (:mod:`dw_dagster.core.autonomy`, where the review page reads it too) counts,
per (domain, change class), the change sets applied, those whose receipt verified, those undone (an
applied undo change set names them), those failed, the latest failure with its note, and the clean
streak (verified repairs in a row, none undone, since the last failure).
:func:`propose_autonomy_change` turns the records into a change to the domains file, as a diff an
operator approves like any other: a class whose clean streak reached the domain's
``earn_after`` is added to ``allowed_change_classes`` (autonomy raised to L3 where it was lower); a
class that is allowed and failed (or was undone) since is removed. It never edits the file itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from dw_dagster.core.autonomy import ClassRecord, autonomy_records
from dw_dagster.proposals.watermark import unified_diff


class _Indented(yaml.SafeDumper):
    """Lists indented under their key, as domains files are written (``domains:`` then ``  - name: ...``)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)


def propose_autonomy_change(domains_text: str, recs: Sequence[ClassRecord], *, path: str = "domains.yaml") -> str | None:
    """The diff of the domains file that raises or lowers autonomy per the records, or None (module docstring)."""
    doc = yaml.safe_load(domains_text) or {}
    changed = False
    for d in doc.get("domains") or []:
        earn = d.get("earn_after")
        allowed = list(d.get("allowed_change_classes") or [])
        for rec in (r for r in recs if r.domain == d.get("name")):
            if rec.change_class in allowed and (rec.failed or rec.undone) and rec.clean_streak == 0:
                allowed.remove(rec.change_class)
                changed = True
            elif earn and rec.change_class not in allowed and rec.clean_streak >= int(earn):
                allowed.append(rec.change_class)
                if d.get("autonomy", "L2") in ("L1", "L2"):
                    d["autonomy"] = "L3"
                changed = True
        if allowed != list(d.get("allowed_change_classes") or []):
            d["allowed_change_classes"] = allowed
    if not changed:
        return None
    after = yaml.dump(doc, Dumper=_Indented, sort_keys=False, default_flow_style=None, width=120)
    return unified_diff({path: (domains_text, after)})


__all__ = ["ClassRecord", "autonomy_records", "propose_autonomy_change"]
