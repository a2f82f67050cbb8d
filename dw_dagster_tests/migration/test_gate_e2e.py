"""The completion gate end to end through the sensors (:class:`~dw_dagster.testing.local_daemon.LocalSensorDaemon`,
the daemon's work in process) on a SQLite-backed instance: the embedded default (DuckDB → DuckDB) and
PostgreSQL → DuckDB.

One story per source, run once and shared by the tests that read it: a pair that holds only
intermittently never opens the gate; a materialization reported from outside claiming the wave is
signed off signs nothing; a sign-off request whose evidence changed is superseded and a decision on
the old evidence is refused; a colleague who is not the owner cannot sign off (a typed email, their
own login, the proposer, the step job launched by hand as the Launchpad or ``dagster job execute``
would, a re-executed stage run with its copied tags, the owner's token used twice); the owner signs
off through the identity provider and ``wave_sign_off`` receipts land in every asset's chain; a
dropped target table reopens the wave and opens an incident; evidence changed between the approval
and the sign-off step refuses the step.
"""

import io
import os
import uuid

import dagster as dg
import pytest

from dw_dagster import records
from dw_dagster.core.signing import ApprovalRefused
from dw_dagster.approval.job import approve_in_process, decide, identity_from_token
from dw_dagster.core.domains import resolve_domains
from dw_dagster.core.ledger import ledger_for
from dw_dagster.databases import DuckDBDatabase, SqlAlchemyDatabase
from dw_dagster.migration.state import gate_record
from dw_dagster.migration.status import migration_status, table_wave
from dw_dagster_dev.demo import Timeline, demo_login, run_repair_stages
from dw_dagster.testing.local_daemon import LocalSensorDaemon
from dw_dagster_dev.services import OidcProvider
from dw_dagster_tests.conftest import POSTGRES_URL

OWNER, COLLEAGUE = "dana.ortiz@grocer.example", "sam.lee@grocer.example"
SIGN_OFF = "so-m-w1"
DOMAINS = """domains:
  - name: pos
    assets: [[a], [b], [migration, m, w1]]
    approvers: [dana.ortiz@grocer.example]
    identity: verified
identity:
  oidc:
    issuer: {env: DW_OIDC_ISSUER}
    audience: dw-dagster
"""
_STORIES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def oidc(tmp_path_factory):
    with OidcProvider(tmp_path_factory.mktemp("oidc"), [OWNER, COLLEAGUE]) as p:
        yield p


class Tables:
    """Source tables (DuckDB file or a PostgreSQL schema) and their copies in a DuckDB warehouse."""

    def __init__(self, source: str, home):
        self.home, self.wh = home, DuckDBDatabase(home / "wh.duckdb")
        if source == "postgres":
            self.src, self.schema = SqlAlchemyDatabase(POSTGRES_URL), f"gate_{uuid.uuid4().hex[:8]}"
            self.url = POSTGRES_URL
        else:
            self.src, self.schema = DuckDBDatabase(home / "src.duckdb"), "pos"
            self.url = f"duckdb:///{home}/src.duckdb"
        self.src.execute(f"CREATE SCHEMA {self.schema}")
        self.wh.execute(f"CREATE SCHEMA {self.schema}")
        self.ddl = {"a": "id INTEGER, region VARCHAR(8), amt DECIMAL(10,2)", "b": "id INTEGER, g INTEGER"}
        self.src.execute(f"CREATE TABLE {self.schema}.a ({self.ddl['a']})")
        self.src.execute(f"INSERT INTO {self.schema}.a VALUES " + ", ".join(f"({i}, '{'NS'[i % 2]}', {i}.5)"
                                                                          for i in range(1, 61)))
        self.src.execute(f"CREATE TABLE {self.schema}.b ({self.ddl['b']})")
        self.src.execute(f"INSERT INTO {self.schema}.b VALUES " + ", ".join(f"({i}, {i % 3})" for i in range(1, 41)))
        for t in ("a", "b"):
            self.copy(t)

    def copy(self, table: str) -> None:
        import pyarrow as pa

        data = pa.Table.from_batches(list(self.src.fetch_batches(f"SELECT * FROM {self.schema}.{table}")))
        with self.wh.connect() as con:
            con.register("x", data)  # the loader keeps the source's types (Arrow would infer DECIMAL(4,2) from 61.50)
            con.execute(f"CREATE OR REPLACE TABLE {self.schema}.{table} ({self.ddl[table]})")
            con.execute(f"INSERT INTO {self.schema}.{table} BY NAME SELECT * FROM x")

    def both(self, statement: str) -> None:
        self.src.execute(statement.format(s=self.schema))
        self.wh.execute(statement.format(s=self.schema))

    def close(self):
        if isinstance(self.src, SqlAlchemyDatabase):
            self.src.execute(f"DROP SCHEMA {self.schema} CASCADE")
            self.src.dispose()


def _config(t: Tables) -> dict:
    pair = lambda name, **kw: {"source": {"database": "src", "table": f"{t.schema}.{name}"},  # noqa: E731
                               "target": {"asset": name, "database": "wh", "table": f"{t.schema}.{name}"}, **kw}
    return {"domains": str(t.home / "domains.yaml"),
            "databases": {"src": {"url": t.url}, "wh": {"url": f"duckdb:///{t.home}/wh.duckdb"}},
            "migration": {"name": "m", "gate": {"consecutive": 2},
                          "waves": [{"name": "w1", "domain": "pos", "pairs": [
                              pair("a", key=["id"], slice_by=["region"], sums=["amt"]), pair("b", key=["id"])]}]}}


def _story(source: str, home) -> dict:  # noqa: C901 - one story, told in order
    from dw_dagster import build_dw_definitions

    (home / "domains.yaml").write_text(DOMAINS)
    t = Tables(source, home)
    out: dict = {"refused": {}}
    try:
        specs = [dg.AssetSpec("a"), dg.AssetSpec("b")]
        defs = dg.Definitions.merge(build_dw_definitions(_config(t), assets=specs), dg.Definitions(assets=specs))
        (home / "dagster_home").mkdir(exist_ok=True)
        instance = dg.DagsterInstance.local_temp(str(home / "dagster_home"))
        daemon = LocalSensorDaemon(defs, instance, log_level="WARNING")
        job = defs.resolve_job_def("dw_migration__m__w1")
        domains = home / "domains.yaml"

        def evaluate() -> dict:
            assert job.execute_in_process(instance=instance, raise_on_error=False).success
            return migration_status(instance, "m")[0]

        def approve(**how) -> tuple[bool, str]:
            return approve_in_process(instance, SIGN_OFF, domains=domains, comment="reviewed", **how)

        # 1. intermittent: b holds, fails, holds, fails, holds: never two evaluations in a row
        out["intermittent"] = []
        for i in range(5):
            if i % 2:
                t.wh.execute(f"DELETE FROM {t.schema}.b WHERE id = 7")
            elif i:
                t.wh.execute(f"INSERT INTO {t.schema}.b VALUES (7, 1)")
            w = evaluate()
            out["intermittent"].append((w["state"], gate_record(instance, "m", "w1")["requested"]))
        # 2. a reported materialization claiming the wave is signed off signs nothing
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=["migration", "m", "w1"], metadata={"dw/migration_state": "signed_off",
                                                           "dw/migration_wave": dg.MetadataValue.json({"state": "signed_off"})}))
        out["forged"] = migration_status(instance, "m")[0]["state"]
        # 3. the gate opens on the second holding evaluation in a row
        w = evaluate()
        req1 = gate_record(instance, "m", "w1")["requested"]
        out["opened"] = (w["state"], req1)
        token_v1 = demo_login(domains, SIGN_OFF, OWNER, instance)
        # 4. new numbers, still holding: the request is superseded by one on the new evidence
        t.both("INSERT INTO {s}.a VALUES (61, 'N', 61.5)")
        evaluate()
        req2 = gate_record(instance, "m", "w1")["requested"]
        out["superseded"] = (req1["version"], req2["version"], ledger_for(instance).change_set_row(SIGN_OFF, req1["version"]).state)
        out["refused"]["token bound to the old evidence"] = approve(id_token=token_v1)[1]
        doms = resolve_domains(domains)
        token_v2 = demo_login(domains, SIGN_OFF, OWNER, instance)
        ident = identity_from_token(doms, token_v2, change_set_id=SIGN_OFF, version=req2["version"], decision="approve")
        try:
            decide(instance, SIGN_OFF, "approve", ident, domains=doms, version=req1["version"])
        except ApprovalRefused as e:
            out["refused"]["decision on the version read before"] = str(e)
        # 5. a colleague who is not the owner
        out["refused"]["the proposer"] = approve(approver="dw-dagster")[1]
        out["refused"]["the owner's email typed"] = approve(approver=OWNER)[1]
        out["refused"]["a colleague logged in"] = approve(id_token=demo_login(domains, SIGN_OFF, COLLEAGUE, instance))[1]
        step = defs.resolve_job_def("dw_step_wave_sign_off")
        config = {"ops": {"dw_apply_wave_sign_off_step": {"config": {"change_set_id": SIGN_OFF, "step_index": 0}}}}
        by_hand = step.execute_in_process(instance=instance, run_config=config, raise_on_error=False)
        out["refused"]["the step job launched by hand"] = "" if by_hand.success else _failure(by_hand)
        out["ran_unapproved"] = bool(daemon.tick("dw_remediation_sensor").run_ids)
        # 6. the owner signs off; the same token again is refused
        ok, msg = approve(id_token=demo_login(domains, SIGN_OFF, OWNER, instance))
        out["owner"] = (ok, msg)
        out["refused"]["the owner's decision again"] = approve(id_token=token_v2)[1]
        stage = daemon.tick("dw_remediation_sensor")
        first = instance.get_run_by_id(stage.run_ids[0])
        again = step.execute_in_process(instance=instance, run_config=config, tags=dict(first.tags), raise_on_error=False)
        out["refused"]["the stage run re-executed with its tags"] = "" if again.success else _failure(again)
        run_ids = {first.tags["dw/stage"]: first.run_id}
        run_repair_stages(daemon, instance, run_ids, Timeline(io.StringIO()), ticks=6, describe=lambda s, r: "")
        out["stages"] = sorted(run_ids)
        out["receipts"] = [r for r in records.receipts(instance) if r.change_set_id == SIGN_OFF]
        from dw_dagster.receipts.chain import verify_receipts

        out["chain"] = verify_receipts(instance)
        out["signed"] = evaluate()
        # 7. a dropped target table reopens the wave and opens an incident
        t.wh.execute(f"DROP TABLE {t.schema}.b")
        out["reopened"] = evaluate()
        daemon.tick("dw_check_incident_sensor")
        out["incidents"] = [i for i in records.incidents(instance) if i.asset_key == ["b"]]
        out["table_wave"] = table_wave(instance, dg.AssetKey("b"))
        out["mcp"] = _mcp_status(home / "dagster_home")
        # 8. evidence changed between the owner's approval and the sign-off step
        t.copy("b")
        evaluate()
        w = evaluate()
        req3 = gate_record(instance, "m", "w1")["requested"]
        out["reopened_request"] = (w["state"], req3)
        ok3, _ = approve(id_token=demo_login(domains, SIGN_OFF, OWNER, instance))
        t.wh.execute(f"UPDATE {t.schema}.a SET amt = 0 WHERE id = 3")
        tick = daemon.tick("dw_remediation_sensor")
        out["late_change"] = (ok3, tick.run_ids + tick.failed_run_ids,
                              [e for rid in tick.run_ids + tick.failed_run_ids for e in _step_results(instance, rid)],
                              gate_record(instance, "m", "w1"))
    finally:
        t.close()
    return out


def _mcp_status(dagster_home) -> dict:
    """What the MCP tool ``get_migration_status`` answers on the instance (in-memory MCP client)."""
    import asyncio
    import json

    from mcp import Client

    from dw_dagster.mcp.server import build_server
    from dw_dagster.mcp.state import ServerSettings

    async def call():
        async with Client(build_server(ServerSettings(dagster_home=str(dagster_home)))) as c:
            res = await c.call_tool("get_migration_status", {"migration": "m"})
            return res.structured_content or json.loads(res.content[0].text)

    return asyncio.run(call())


def _failure(result) -> str:
    ev = next((e for e in result.all_events if e.is_step_failure), None)
    return ev.event_specific_data.error.message if ev is not None and ev.event_specific_data.error else "failed"


def _step_results(instance, run_id: str) -> list[dict]:
    out = []
    for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION):
        md = e.dagster_event.event_specific_data.asset_observation.metadata
        if "dw/step_result" in md:
            out.append(md["dw/step_result"].value)
    return out


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def story(request, oidc, tmp_path_factory):
    if request.param not in _STORIES:
        _STORIES[request.param] = _story(request.param, tmp_path_factory.mktemp(f"gate_{request.param}"))
    return _STORIES[request.param]


def test_a_pair_holding_only_intermittently_never_opens_the_gate(story):
    assert [s for s, _ in story["intermittent"]] == ["holding", "failing", "holding", "failing", "holding"]
    assert all(req is None for _, req in story["intermittent"])


def test_a_reported_materialization_signs_nothing(story):
    assert story["forged"] != "signed_off"


def test_the_gate_opens_after_consecutive_holds_bound_to_the_evidence(story):
    state, req = story["opened"]
    assert state == "awaiting_sign_off" and req["change_set_id"] == SIGN_OFF and len(req["evidence_hash"]) == 32


def test_a_sign_off_on_changed_evidence_is_refused(story):
    v1, v2, state = story["superseded"]
    assert v1 != v2 and state == "superseded"
    assert "nonce" in story["refused"]["token bound to the old evidence"].lower() or \
        "superseded" in story["refused"]["token bound to the old evidence"]
    assert "changed since you read it" in story["refused"]["decision on the version read before"]
    ok3, runs, results, gate = story["late_change"]
    assert ok3 and runs and results and results[0]["refused"]
    assert "evidence changed since the sign-off was requested" in results[0]["reason"]
    assert gate["signed_off"] is None


def test_a_colleague_who_is_not_the_owner_cannot_sign_off(story):
    r = story["refused"]
    assert "proposed change set" in r["the proposer"]
    assert "needs a verified identity" in r["the owner's email typed"]
    assert "is not an approver of domain 'pos'" in r["a colleague logged in"]
    assert "ticket" in r["the step job launched by hand"].lower()
    assert r["the stage run re-executed with its tags"] and "once" in r["the stage run re-executed with its tags"].lower()
    assert "already decided" in r["the owner's decision again"] or "used" in r["the owner's decision again"]
    assert not story["ran_unapproved"]


def test_the_owner_signs_off_and_receipts_land_on_every_asset_of_the_wave(story):
    assert story["owner"][0], story["owner"][1]
    assert story["stages"] == ["receipt", "verify", "wave_sign_off-1"]
    receipts = story["receipts"]
    assert sorted("/".join(r.asset_key) for r in receipts) == ["a", "b", "migration/m/w1"]
    assert all(r.kind == "wave_sign_off" and r.verified and r.approver == OWNER for r in receipts)
    checked, problems = story["chain"]
    assert checked >= 3 and problems == []
    w = story["signed"]
    assert w["state"] == "signed_off" and w["signed_off_by"]["email"] == OWNER and w["signed_off_by"]["method"] == "oidc"


def test_a_dropped_target_table_reopens_the_wave(story):
    w = story["reopened"]
    assert w["state"] == "reopened" and "b: schema" in w["reopened"]["cause"]
    assert next(p for p in w["pairs"] if p["target"] == "b")["state"].startswith("reopened")
    assert story["incidents"] and story["incidents"][0].check_name.startswith("parity_")
    assert story["table_wave"]["wave"] == "w1" and story["table_wave"]["wave_state"] == "reopened"
    (wave,) = story["mcp"]["waves"]  # the MCP tool answers the same
    assert wave["state"] == "reopened" and wave["reopened"]["cause"] == story["reopened"]["reopened"]["cause"]
    state, req = story["reopened_request"]
    assert state == "reopened" and req is not None  # holding again: a new sign-off is needed
