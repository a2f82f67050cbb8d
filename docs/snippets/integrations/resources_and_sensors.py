from dw_dagster import (LightupResource, PagerDutyResource, SlackResource, build_lightup_incident_sensor,
                        build_lightup_compare_check, build_notification_sensor)

resources = {
    "lightup": LightupResource(credential_file=dg.EnvVar("LIGHTUP_CREDENTIAL_FILE")),  # or server + refresh_token
    "pager": PagerDutyResource(routing_key=dg.EnvVar("PAGERDUTY_ROUTING_KEY"), api_token=dg.EnvVar("PAGERDUTY_API_TOKEN"),
                               from_email="oncall@grocer.example"),          # or OpsgenieResource(api_key=...)
    "slack": SlackResource(bot_token=dg.EnvVar("SLACK_BOT_TOKEN"), default_channel="C0DWAPPROV"),
}
sensors = [
    build_lightup_incident_sensor(table_assets={"warehouse:pos.sales_line": "store_sales_line"},
                                  diagnosis_job_name="dw_diagnose_incident"),
    build_notification_sensor(lightup_resource_key="lightup", pager_resource_key="pager", slack_resource_key="slack",
                              dagster_url="https://dagster.grocer.example", location_name="store_sales"),
]
