# Draft warehouse setting changes from last month's symptoms and propose them to their owners.
import datetime as dt

import dagster as dg

from dw_dagster.core.domains import load_domains
from dw_dagster.cost.models import Period
from dw_dagster.cost.sources import CostResource
from dw_dagster.cost.warehouse import Rules, draft_warehouse_changes
from dw_dagster.proposals.change_sets import propose


def draft_and_propose(instance: dg.DagsterInstance, cost: CostResource, domains_file: str, today: dt.date) -> list[str]:
    period = Period.last_days(30, until=today)
    drafts, notes = draft_warehouse_changes(cost.source(instance), period, load_domains(domains_file),
                                            rules=Rules(idle_share=0.15, auto_suspend=60, measure_days=7))
    for note in notes:  # e.g. a warehouse no domain lists
        print(note)
    return [propose(instance, cs)[0].id for cs in drafts]
