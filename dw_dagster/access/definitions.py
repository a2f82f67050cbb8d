"""One call that puts access requests on a code location: the ``dw_access`` asset, the grant and
revoke jobs, the access sensor and (unless the location already has them) the approval job and the
expiry sensor that marks and escalates unanswered approvals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dw_dagster.dagster_private import beta, public
import dagster as dg

from dw_dagster.access.jobs import PAGER_KEY, build_access_jobs
from dw_dagster.access.notify import Notifier
from dw_dagster.access.request import access_asset_spec
from dw_dagster.access.sensor import build_access_sensor
from dw_dagster.core.domains import DomainsSource


@public
@beta
def build_access_definitions(*, databases: Mapping[str, Any], domains: DomainsSource = None,
                             notifiers: Sequence[Notifier] = (), pager: Any = None, minimum_interval_seconds: int = 30,
                             with_approvals: bool = True, executor: dg.ExecutorDefinition | None = None,
                             reissue_after_seconds: float | None = None,
                             default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED) -> dg.Definitions:
    """Access requests on a code location (see :mod:`dw_dagster.access`).

    Args:
        databases: resource key → :class:`~dw_dagster.databases.DatabaseResource` (PostgreSQL or
            Snowflake, connecting as a role that may grant and revoke); requests name one of these
            keys, or a URL one of them points at.
        domains: the domains file (owners, identity providers, ``access:`` settings); default
            ``$DW_DOMAINS_FILE``, read at each tick and decision.
        notifiers: where reminders go (:class:`~dw_dagster.access.notify.EmailNotifier`,
            :class:`~dw_dagster.access.notify.SlackNotifier`).
        pager: a PagerDuty or Opsgenie resource paged when a revoke fails, or None.
        minimum_interval_seconds: the access sensor's interval.
        with_approvals: add the approval job and the expiry sensor (leave out when the location
            already has them from :func:`dw_dagster.build_dw_definitions`).
        executor: the jobs' executor (default the guarded in-process one).
        reissue_after_seconds: replace a ticket no run took after this long (see the access sensor).
        default_status: the sensors' default status.

    Returns:
        ``Definitions`` to merge into yours (``dg.Definitions.merge``). Put
        :class:`~dw_dagster.GuardedRunCoordinator` in ``dagster.yaml`` so a hand-launched run is
        refused at submission too.
    """
    grant_job, revoke_job = build_access_jobs(list(databases), domains=domains, pager=pager is not None, executor=executor)
    sensors = [build_access_sensor(grant_job=grant_job, revoke_job=revoke_job, domains=domains, notifiers=notifiers,
                                   minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
                                   reissue_after_seconds=reissue_after_seconds)]
    jobs = [grant_job, revoke_job]
    if with_approvals:
        from dw_dagster.approval.job import build_approval_job
        from dw_dagster.approval.autonomy import build_expiry_sensor

        jobs.append(build_approval_job(domains))
        sensors.append(build_expiry_sensor(domains=domains, minimum_interval_seconds=min(300, minimum_interval_seconds * 2),
                                           default_status=default_status))
    resources = {**databases, **({PAGER_KEY: pager} if pager is not None else {})}
    return dg.Definitions(assets=[access_asset_spec()], jobs=jobs, sensors=sensors, resources=resources)


__all__ = ["build_access_definitions"]
