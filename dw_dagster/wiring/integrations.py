"""The integrations (Lightup, PagerDuty, Slack, tickets, email) and the migration that
:func:`~dw_dagster.definitions.build_dw_definitions` adds to the loop, as configured."""

from __future__ import annotations

import os

import dagster as dg

from dw_dagster.config import DataOpsConfig
from dw_dagster.errors import DwConfigError
from dw_dagster.wiring.checks import asset_key
from dw_dagster.wiring.tickets import tickets_and_email


def migration_definitions(cfg: DataOpsConfig, resources: dict, domains, source):
    """The migration's definitions (:mod:`dw_dagster.migration.build`), or None without one."""
    if cfg.migration is None:
        return None
    from dw_dagster.core.domains import resolve_domains
    from dw_dagster.migration.build import build_migration

    lightup = cfg.integrations.lightup
    lightup_key = "lightup" if lightup is not None and (not lightup.optional or lightup_credentials_set()) else None
    return build_migration(cfg.migration, resources=resources, database_names=sorted(cfg.databases), domains=domains,
                           lightup_resource_key=lightup_key, source=source, domains_model=resolve_domains(domains))


def _credentials_set(*names: str) -> bool:
    return all(os.environ.get(n) for n in names)


def lightup_credentials_set() -> bool:
    from dw_dagster.integrations.lightup import CREDENTIAL_FILE_ENV, REFRESH_TOKEN_ENV, SERVER_ENV

    return _credentials_set(CREDENTIAL_FILE_ENV) or _credentials_set(SERVER_ENV, REFRESH_TOKEN_ENV)


def integration_definitions(cfg: DataOpsConfig, resources: dict, diagnosis_job_name: str, domains, status):
    """Lightup, PagerDuty and Slack as configured (their secrets read from the named env vars at run
    time); an ``optional`` one whose credentials are not in the environment now is left out."""
    from dw_dagster.approval.autonomy import build_expiry_sensor

    integ = cfg.integrations
    lightup = integ.lightup if integ.lightup and (not integ.lightup.optional or lightup_credentials_set()) else None
    pager = (integ.pagerduty if integ.pagerduty and (not integ.pagerduty.optional
                                                     or _credentials_set(integ.pagerduty.routing_key_env)) else None)
    slack = integ.slack if integ.slack and (not integ.slack.optional or _credentials_set(integ.slack.bot_token_env)) else None
    checks, sensors = [], []
    if lightup is not None:
        from dw_dagster.integrations.lightup import LightupResource
        from dw_dagster.detection.lightup import build_lightup_compare_check, build_lightup_incident_sensor

        resources["lightup"] = LightupResource(workspace=lightup.workspace)
        sensors.append(build_lightup_incident_sensor(table_assets={t: asset_key(k) for t, k in lightup.tables.items()},
                                                     diagnosis_job_name=diagnosis_job_name, domains=domains,
                                                     default_status=status))
        if lightup.compare_metrics:
            watched = {a.key for a in cfg.assets}
            target = lightup.compare_asset or next((k for k in lightup.tables.values() if k in watched),
                                                   next(iter(lightup.tables.values()), None))
            if target is None:
                raise DwConfigError("integrations.lightup.compare_asset: no asset for the compare check (tables is empty)")
            checks.append(build_lightup_compare_check(asset=asset_key(target), compare_metric_uuids=lightup.compare_metrics))
    if pager is not None:
        from dw_dagster.integrations.pagerduty import PagerDutyResource

        token = pager.api_token_env if pager.api_token_env and (not pager.optional or _credentials_set(pager.api_token_env)) else None
        resources["pager"] = PagerDutyResource(
            routing_key=dg.EnvVar(pager.routing_key_env), api_token=dg.EnvVar(token) if token else None,
            from_email=pager.from_email, events_base_url=pager.events_url, rest_base_url=pager.api_url)
    if slack is not None:
        from dw_dagster.integrations.slack import SlackResource

        resources["slack"] = SlackResource(bot_token=dg.EnvVar(slack.bot_token_env), base_url=slack.api_url,
                                           default_channel=slack.channel)
    sensors.append(build_expiry_sensor(domains=domains, default_status=status))
    tickets, email = tickets_and_email(integ, resources)
    if lightup or pager or slack or tickets or email:
        from dw_dagster.integrations.notifications import build_notification_sensor

        sensors.append(build_notification_sensor(
            dagster_url=integ.dagster_url, location_name=cfg.location_name, review_url=integ.review_url,
            lightup_resource_key="lightup" if lightup else None,
            pager_resource_key="pager" if pager else None,
            slack_resource_key="slack" if slack else None, slack_channel=slack.channel if slack else None,
            email_resource_key="email" if email else None, ticket_resource_keys=tickets, domains=domains,
            default_status=status, minimum_interval_seconds=cfg.sensor_interval_seconds))
    return checks, sensors
