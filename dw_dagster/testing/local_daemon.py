"""Evaluate sensors and launch their run requests in this process, as the Dagster daemon would.

``dagster dev`` runs the sensor daemon and a run launcher; the demo and the tests use this
stand-in so the whole loop runs in one process against a real Dagster instance: each tick is
evaluated with ``SensorDefinition.evaluate_tick`` on a context built for the instance, the
asset events it returns are stored with ``report_runless_asset_event`` (as the daemon does), the
cursor is kept between ticks, and each run request is executed in process with the run key and
sensor tags, skipping run keys this sensor already launched (the daemon's de-duplication). Before a
run starts it passes dw_dagster's guard (:func:`dw_dagster.guard.admission.admit_run`) as a run
coordinator would, and records the end of the stage it held, as the guarded executor would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from dw_dagster.core.asset_graph import CURRENT_DEFINITIONS

RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"


@dataclass
class TickResult:
    sensor: str
    run_ids: list[str] = field(default_factory=list)
    failed_run_ids: list[str] = field(default_factory=list)
    skip_reason: str | None = None
    asset_events: int = 0
    events: list = field(default_factory=list)
    cursor: str | None = None


class LocalSensorDaemon:
    """Ticks the sensors of one ``Definitions`` object against one instance."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance, log_level: str = "INFO") -> None:
        self.defs = defs
        self.instance = instance
        self.log_level = log_level
        self.cursors: dict[str, str | None] = {}
        self.refusals: list[str] = []

    def _execute(self, sensor_name: str, rr: dg.RunRequest) -> tuple[str, bool]:
        from dagster._core.utils import make_new_run_id

        from dw_dagster.core.ledger import asset_str
        from dw_dagster.guard.admission import (
            TICKET_TAG,
            RunFacts,
            RunRefused,
            admit_run,
            finish_run_stage,
            job_tags_of,
        )

        tags = {**(rr.tags or {}), SENSOR_NAME_TAG: sensor_name}
        if rr.run_key:
            tags[RUN_KEY_TAG] = rr.run_key
        job_name = rr.job_name or self.defs.resolve_sensor_def(sensor_name).job_name
        if job_name is None:
            raise ValueError(f"run request from {sensor_name} names no job")
        job = self.defs.resolve_job_def(job_name)
        tags = {**(job.tags or {}), **tags}
        run_id = make_new_run_id()
        selection = list(rr.asset_selection) if rr.asset_selection else None
        keys = [asset_str(k) for k in (selection or job.asset_layer.executable_asset_keys if job.asset_layer else [])]
        try:  # what the run coordinator and the guarded executor do before a daemon-launched run
            admit_run(self.instance, RunFacts(run_id, job_name, tags, tuple(keys),
                                              tuple(sorted(asset_str(k) for k in selection)) if selection else None,
                                              dict(rr.run_config or {}),
                                              tuple(sorted(k.to_user_string() for k in rr.asset_check_keys))
                                              if rr.asset_check_keys is not None else None, job_tags=job_tags_of(job)))
        except RunRefused as e:
            self.refusals.append(e.description)
            return run_id, False
        token = CURRENT_DEFINITIONS.set(self.defs)
        try:
            result = self._run(job, rr, tags, selection, run_id)
        finally:
            CURRENT_DEFINITIONS.reset(token)
        finish_run_stage(self.instance, result.run_id, tags.get(TICKET_TAG), result.success)
        return result.run_id, result.success

    def _run(self, job, rr: dg.RunRequest, tags: dict, selection, run_id: str):
        return job.execute_in_process(
            instance=self.instance,
            run_config={**(rr.run_config or {}), "loggers": {"console": {"config": {"log_level": self.log_level}}}},
            tags=tags,
            partition_key=rr.partition_key,
            asset_selection=selection,
            raise_on_error=False,
            run_id=run_id,
        )

    def tick(self, sensor_name: str) -> TickResult:
        """Evaluate one tick of ``sensor_name`` and run what it requests, in order."""
        sensor = self.defs.resolve_sensor_def(sensor_name)
        resources = {k: v for k, v in (self.defs.resources or {}).items() if k in sensor.required_resource_keys}
        context = dg.build_sensor_context(instance=self.instance, cursor=self.cursors.get(sensor_name),
                                          definitions=self.defs, sensor_name=sensor_name, resources=resources or None)
        data = sensor.evaluate_tick(context)
        if data.cursor is not None:
            self.cursors[sensor_name] = data.cursor
        out = TickResult(sensor=sensor_name, skip_reason=data.skip_message, cursor=self.cursors.get(sensor_name))
        for event in data.asset_events or []:
            self.instance.report_runless_asset_event(event)
            out.asset_events += 1
            out.events.append(event)
        for rr in data.run_requests or []:
            if rr.run_key and self.instance.get_runs(
                filters=dg.RunsFilter(tags={RUN_KEY_TAG: rr.run_key, SENSOR_NAME_TAG: sensor_name}), limit=1
            ):
                continue
            run_id, ok = self._execute(sensor_name, rr)
            (out.run_ids if ok else out.failed_run_ids).append(run_id)
        return out


