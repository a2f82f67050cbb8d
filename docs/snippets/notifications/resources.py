import dagster as dg

from dw_dagster.integrations.jira import JiraResource
from dw_dagster.integrations.mail import EmailResource
from dw_dagster.integrations.notifications import build_notification_sensor
from dw_dagster.integrations.servicenow import ServiceNowResource
from dw_dagster.integrations.slack import SlackResource
from dw_dagster.approval.autonomy import build_expiry_sensor

notifications = dg.Definitions(
    sensors=[
        build_expiry_sensor(domains="domains.yaml"),  # the escalation ladder
        build_notification_sensor(
            slack_resource_key="slack", email_resource_key="email", ticket_resource_keys=["jira", "servicenow"],
            domains="domains.yaml", review_url="https://review.grocer.example",
            dagster_url="https://dagster.grocer.example"),
    ],
    resources={
        "slack": SlackResource(bot_token=dg.EnvVar("SLACK_BOT_TOKEN"), default_channel="C0DWAPPROV"),
        "email": EmailResource(host="smtp.grocer.example", sender="dw-dagster@grocer.example",
                               username_env="DW_SMTP_USER", password_env="DW_SMTP_PASSWORD"),
        "jira": JiraResource(base_url="https://grocer.atlassian.net", email="dw-bot@grocer.example",
                             api_token=dg.EnvVar("JIRA_API_TOKEN"), project_key="DATA"),
        "servicenow": ServiceNowResource(instance_url="https://grocer.service-now.com", username="dw.integration",
                                         password=dg.EnvVar("SERVICENOW_PASSWORD")),
    },
)
