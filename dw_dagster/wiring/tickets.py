"""The ticket systems and email of a location's notifications (Jira, ServiceNow, SMTP), as configured."""

from __future__ import annotations

import os

import dagster as dg


def _credentials_set(*names: str) -> bool:
    return all(os.environ.get(n) for n in names)


def tickets_and_email(integ, resources: dict) -> tuple[list[str], bool]:
    """Jira, ServiceNow and email resources as configured (secrets read from the named env vars at run
    time); the resource keys of the ticket systems, and whether email is on."""
    tickets = []
    if integ.jira and (not integ.jira.optional or _credentials_set(integ.jira.api_token_env)):
        from dw_dagster.integrations.jira import JiraResource

        j = integ.jira
        resources["jira"] = JiraResource(base_url=j.url, email=j.email, api_token=dg.EnvVar(j.api_token_env),
                                         project_key=j.project_key, issue_type=j.issue_type, done_transition=j.done_transition)
        tickets.append("jira")
    if integ.servicenow and (not integ.servicenow.optional or _credentials_set(integ.servicenow.password_env)):
        from dw_dagster.integrations.servicenow import ServiceNowResource

        n = integ.servicenow
        resources["servicenow"] = ServiceNowResource(instance_url=n.instance_url, username=n.username,
                                                     password=dg.EnvVar(n.password_env),
                                                     assignment_group=n.assignment_group, close_code=n.close_code)
        tickets.append("servicenow")
    e = integ.email
    if e and (not e.optional or not e.username_env or _credentials_set(e.username_env, e.password_env)):
        from dw_dagster.integrations.mail import EmailResource

        resources["email"] = EmailResource(host=e.host, port=e.port, sender=e.sender, username_env=e.username_env,
                                           password_env=e.password_env, starttls=e.starttls, ca_file=e.ca_file)
        return tickets, True
    return tickets, False


__all__ = ["tickets_and_email"]
