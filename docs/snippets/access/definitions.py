import dagster as dg

from dw_dagster import DatabaseResource, build_access_definitions
from dw_dagster.access import EmailNotifier

access = build_access_definitions(
    databases={"warehouse": DatabaseResource(url=dg.EnvVar("WAREHOUSE_ADMIN_URL"))},  # a role that may GRANT and REVOKE
    domains="domains.yaml",
    notifiers=[EmailNotifier(host="smtp.grocer.example", port=587, sender="dw-dagster@grocer.example", starttls=True)],
)
defs = dg.Definitions.merge(access)  # and your other definitions
