"""The ledger: dw_dagster's state machine per change set, incident and receipt chain, with atomic transitions.

The event log shows what happened (every ``dw/`` observation stays there for the asset page);
the ledger decides what *may* happen next. It lives in the Dagster instance's own storage:

- SQLite (Dagster's default): ``<instance>/history/dw_ledger.db``, next to ``runs.db``;
- PostgreSQL (``dagster-postgres``): tables ``dw_ledger_*`` in the same database as the run
  storage (its ``postgres_url``); MySQL storage is not supported (no partial unique indexes);
- an ephemeral in-memory instance: an in-memory SQLite database that lives as long as the instance.

Every transition is one transaction whose guard is a unique key or a compare-and-set ``UPDATE``:

- a change set version is recorded once; re-proposing the same content returns the first record
  (same version, same expiry: proposing again never renews it);
- a version has at most one *active* decision (partial unique index on ``(change_set_id,
  version) WHERE active``), so concurrent approvals record exactly one; a withdrawn decision
  (an autonomous approval after autonomy was lowered, an approver removed from the domain) frees
  the slot for a person;
- a credential (ID token, Slack request signature) is accepted once (primary key);
- a stage of a version has one row (primary key ``(change_set_id, version, stage)``): the remediation
  sensor *issues* a ticket, the run that presents the ticket first *binds* it to its run id, the
  stage's own code *completes* it. Deleting runs deletes nothing here, so nothing replays;
- a receipt chain's head per asset is advanced by compare-and-set, so two receipt writers never
  fork a chain, and a receipt removed from the event log is named by ``receipts verify``.

Lookups are by primary key or indexed column; none reads the event log, so their cost does not
grow with the number of assets or events (benchmarks ``ledger_lookup_5000_assets`` and
``remediation_tick_10k_change_sets``).

Trust: whoever can write the Dagster storage can write the ledger too (see the README's threat
model); decisions and receipts are additionally signed with the deployment's key.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dw_dagster.core.ledger_incidents import (  # noqa: F401 - the incident states are part of this module's API
    CLOSED, DIAGNOSED, DIAGNOSING, DIAGNOSIS_FAILED, OPEN, OPEN_INCIDENT_STATES, QUARANTINED, REDIAGNOSE, UNREPAIRED,
    IncidentsMixin,
)
from dw_dagster.core.ledger_access import AccessMixin
from dw_dagster.core.ledger_finish import FinishMixin
from dw_dagster.core.ledger_ladder import LadderMixin
from dw_dagster.core.ledger_outage import OUTAGE_SECONDS, transient_storage_error, wrap_public_methods  # noqa: F401
from dw_dagster.core.ledger_tables import AccessRow, _sqlite_engine, add_missing_columns, ledger_url  # noqa: F401 - AccessRow is part of the API
from dw_dagster.core.ledger_tables import missing_columns, stored_schema
from dw_dagster.core.ledger_tables import (
    SCHEMA_VERSION,
    ChangeSetRow,
    IncidentRow,
    ReceiptLink,
    StageRow,
    _meta,
    _row,
    audit_t,
    change_sets_t,
    control_t,
    credentials_t,
    decisions_t,
    incidents_t,
    meta_t,
    quarantine_t,
    receipt_heads_t,
    receipts_t,
    stages_t,
)
from dw_dagster.errors import DwDagsterError

from dw_dagster.core.ledger_tables import (  # noqa: F401 - the states are part of this module's API
    ABANDONED, ACTIVE_STATES, APPLIED, APPROVED, ENDED_STATES, EXPIRED, FAILED, HALTED, HELD_STATES, ISSUED, PROPOSED,
    REJECTED, RUNNING, STAGE_FAILED, STARTED, SUCCEEDED, SUPERSEDED,
)
from dw_dagster.dagster_private import public


@public
class LedgerError(DwDagsterError, RuntimeError):
    """The ledger refused a transition or cannot be opened; the message says which and why."""


def asset_str(asset_key: Sequence[str] | Any) -> str:
    """The ledger's text form of an asset key: the path joined by ``/`` (``AssetKey`` or list)."""
    path = getattr(asset_key, "path", asset_key)
    return "/".join(path)


@public
class Ledger(IncidentsMixin, AccessMixin, LadderMixin, FinishMixin):
    """One ledger database (see the module docstring). Get it with :func:`ledger_for`."""

    def __init__(self, engine: Engine, *, url: str) -> None:
        self.engine = engine
        self.url = url
        self._create()

    # -- setup -----------------------------------------------------------------------------------

    def _create(self) -> None:
        for attempt in range(5):
            try:
                self._refuse_newer(stored_schema(self.engine))  # before creating anything in a newer ledger
                _meta.create_all(self.engine, checkfirst=True)
                add_missing_columns(self.engine)
                missing = missing_columns(self.engine)
                if missing:
                    raise LedgerError(f"the ledger at {self.url} lacks columns this dw_dagster needs ("
                                      + "; ".join(f"{t}: {', '.join(cols)}" for t, cols in missing.items())
                                      + "): its tables were altered or made by another program")
                with self.engine.begin() as conn:
                    row = conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema")).first()
                    if row is None:
                        conn.execute(meta_t.insert().values(key="schema", value=str(SCHEMA_VERSION)))
                    else:
                        self._refuse_newer(int(row[0]))
                return
            except (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError):
                if attempt == 4:  # another process creating the same tables at the same moment
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _refuse_newer(self, schema: int | None) -> None:
        if schema is not None and schema > SCHEMA_VERSION:
            raise LedgerError(f"the ledger at {self.url} has schema {schema}; this dw_dagster knows "
                              f"{SCHEMA_VERSION}: upgrade dw_dagster")

    def _tx(self):
        return self.engine.begin()

    # -- change sets -----------------------------------------------------------------------------

    def record_change_set(self, *, change_set_id: str, version: str, content_key: str, target_asset: str,
                          incident_id: str, domain: str, expires_at: float, body: str) -> tuple[ChangeSetRow, bool]:
        """Record a change set version; returns (the record, whether it is new).

        When a version of ``change_set_id`` with the same ``content_key`` (the content without
        its times) is already recorded, that record is returned unchanged: re-proposing the same
        content never renews its expiry. A new version becomes the latest. Earlier versions whose
        repair has not started (proposed, or approved with no stage issued) and halted ones (their
        halt receipt written) are marked superseded: the new version waits for its own decision.
        An earlier version whose repair is under way (a stage issued) is left as it is: the
        remediation sensor walks it to its end, and its window stays held meanwhile.
        """
        now = time.time()
        with self._tx() as conn:
            same = conn.execute(sa.select(change_sets_t).where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.content_key == content_key)).first()
            if same is not None:
                return _row(ChangeSetRow, same), False
            exists = conn.execute(sa.select(change_sets_t.c.version).where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version)).first()
            if exists is not None:
                raise LedgerError(f"change set {change_set_id} version {version} is already recorded with other content")
            started = sa.exists().where(stages_t.c.change_set_id == change_sets_t.c.change_set_id,
                                        stages_t.c.version == change_sets_t.c.version)
            cs_of = change_sets_t.c.change_set_id == change_set_id
            conn.execute(change_sets_t.update().where(cs_of, sa.or_(
                change_sets_t.c.state.in_([PROPOSED, HALTED]),
                sa.and_(change_sets_t.c.state == APPROVED, ~started))).values(
                state=SUPERSEDED, latest=False, updated_at=now,
                note=f"superseded by version {version[:12]}…"))
            conn.execute(change_sets_t.update().where(cs_of, change_sets_t.c.latest.is_(True)).values(
                latest=False, updated_at=now))
            conn.execute(change_sets_t.insert().values(
                change_set_id=change_set_id, version=version, content_key=content_key, target_asset=target_asset,
                incident_id=incident_id, domain=domain, state=PROPOSED, latest=True, recorded_at=now,
                expires_at=expires_at, updated_at=now, note="", body=body))
            row = conn.execute(sa.select(change_sets_t).where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version)).one()
        return _row(ChangeSetRow, row), True

    def change_set_row(self, change_set_id: str, version: str | None = None) -> ChangeSetRow | None:
        """A version of a change set (the latest when ``version`` is None), or None."""
        q = sa.select(change_sets_t).where(change_sets_t.c.change_set_id == change_set_id)
        q = q.where(change_sets_t.c.version == version) if version else q.where(change_sets_t.c.latest.is_(True))
        with self.engine.connect() as conn:
            r = conn.execute(q).first()
        return _row(ChangeSetRow, r) if r is not None else None

    def change_set_rows(self, *, states: Iterable[str] | None = None, target_asset: str | None = None,
                        incident_id: str | None = None, latest_only: bool = True, limit: int | None = None,
                        updated_after: float | None = None) -> list[ChangeSetRow]:
        """Recorded change sets, newest first, filtered on indexed columns (``updated_after``: only rows
        whose state moved after that epoch time)."""
        q = sa.select(change_sets_t)
        if updated_after is not None:
            q = q.where(change_sets_t.c.updated_at > updated_after)
        if latest_only:
            q = q.where(change_sets_t.c.latest.is_(True))
        if states is not None:
            q = q.where(change_sets_t.c.state.in_(list(states)))
        if target_asset is not None:
            q = q.where(change_sets_t.c.target_asset == target_asset)
        if incident_id is not None:
            q = q.where(change_sets_t.c.incident_id == incident_id)
        q = q.order_by(change_sets_t.c.recorded_at.desc())
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_row(ChangeSetRow, r) for r in conn.execute(q)]

    def set_change_set_state(self, change_set_id: str, version: str, state: str, *,
                             from_states: Iterable[str] | None = None, note: str | None = None) -> bool:
        """Move a version to ``state`` (only from ``from_states`` when given); True when it moved.

        A move to an ending state (:data:`ENDED_STATES`: rejected, expired, failed) releases the
        version's incident in the same transaction (:meth:`release_incident`).
        """
        q = change_sets_t.update().where(change_sets_t.c.change_set_id == change_set_id,
                                         change_sets_t.c.version == version)
        if from_states is not None:
            q = q.where(change_sets_t.c.state.in_(list(from_states)))
        values: dict[str, Any] = {"state": state, "updated_at": time.time()}
        if note is not None:
            values["note"] = note
        with self._tx() as conn:
            moved = conn.execute(q.values(**values)).rowcount == 1
            if moved and state in ENDED_STATES:
                self._release(conn, change_set_id, version, f"change set {change_set_id} {state}" + (f": {note}" if note else ""))
            return moved

    def release_incident(self, change_set_id: str, version: str, reason: str) -> bool:
        """Note that a version ended without a repair that proved itself (e.g. a receipt that did not verify).

        Its incident, when ``diagnosed`` and no version of any change set for it is still live
        (proposed, approved, running, halted), becomes ``unrepaired`` in one transaction, with an
        audit entry ``incident_unrepaired`` (by ``dw-dagster``, the version and ``reason``): new
        evidence then diagnoses it again.

        Args:
            change_set_id: the change set.
            version: the version that ended.
            reason: why, for the incident's note and the audit.

        Returns:
            True when the incident moved.
        """
        with self._tx() as conn:
            return self._release(conn, change_set_id, version, reason)

    def _release(self, conn, change_set_id: str, version: str, reason: str) -> bool:
        incident = conn.execute(sa.select(change_sets_t.c.incident_id).where(
            change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version)).scalar()
        if incident is None or conn.execute(sa.select(change_sets_t.c.version).where(
                change_sets_t.c.incident_id == incident, change_sets_t.c.state.in_(ACTIVE_STATES))).first() is not None:
            return False
        now = time.time()
        moved = conn.execute(incidents_t.update().where(incidents_t.c.incident_id == incident,
                                                        incidents_t.c.state == DIAGNOSED).values(
            state=UNREPAIRED, updated_at=now, note=reason[:4000])).rowcount == 1
        if moved:
            conn.execute(audit_t.insert().values(kind="incident_unrepaired", subject=incident, by="dw-dagster", at=now,
                                                 body=json.dumps({"change_set_id": change_set_id, "version": version,
                                                                  "reason": reason})))
        return moved

    # -- decisions -------------------------------------------------------------------------------

    def record_decision(self, *, approval_id: str, change_set_id: str, version: str, decision: str, approver: str,
                        method: str, decided_at: float, body: str, credential_id: str | None = None,
                        credential_purpose: str = "") -> bool:
        """Record the single active decision of a version, atomically; False when one exists already
        (and then a ``credential_id`` given is not consumed).

        A ``credential_id`` (ID token or Slack request digest) is consumed in the same
        transaction: a credential used before raises :class:`LedgerError` and nothing is recorded; so
        does a version that ended meanwhile (superseded, expired, rejected, applied, failed: its row is
        locked for the transaction, so a version superseded at the same moment is never decided).
        """
        with self._tx() as conn:
            state = conn.execute(sa.select(change_sets_t.c.state).where(change_sets_t.c.change_set_id == change_set_id,
                                 change_sets_t.c.version == version).with_for_update()).scalar()
            if state is not None and state not in ACTIVE_STATES:
                raise LedgerError(f"change set {change_set_id} version {version[:12]}… is {state}; a new proposal is needed")
            # the decision first: when the version is decided already, False and the credential stays unspent
            # (the person may use it on what they meant); a spent credential then raises and the
            # transaction, the decision row with it, rolls back
            try:
                with conn.begin_nested():
                    conn.execute(decisions_t.insert().values(
                        approval_id=approval_id, change_set_id=change_set_id, version=version, decision=decision,
                        approver=approver, method=method, decided_at=decided_at, active=True, withdrawn_reason=None,
                        body=body))
            except sa.exc.IntegrityError:
                return False
            if credential_id is not None:
                try:
                    with conn.begin_nested():
                        conn.execute(credentials_t.insert().values(credential_id=credential_id,
                                                                   purpose=credential_purpose[:512], used_at=time.time()))
                except sa.exc.IntegrityError:
                    raise LedgerError("this credential was already used for a decision; each is accepted once") from None
            moved = conn.execute(change_sets_t.update().where(
                change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version,
                change_sets_t.c.state.in_([PROPOSED, HALTED])).values(
                state=APPROVED if decision == "approve" else REJECTED, updated_at=time.time())).rowcount == 1
            if moved and decision != "approve":
                self._release(conn, change_set_id, version, f"change set {change_set_id} rejected by {approver}")
        return True

    def use_credential(self, credential_id: str, purpose: str) -> bool:
        """Consume a credential outside a decision (resume, hold lift); False when it was used before."""
        try:
            with self._tx() as conn:
                conn.execute(credentials_t.insert().values(credential_id=credential_id, purpose=purpose[:512],
                                                           used_at=time.time()))
            return True
        except sa.exc.IntegrityError:
            return False

    def active_decision(self, change_set_id: str, version: str) -> tuple[str, str] | None:
        """``(approval_id, body)`` of the version's active decision, or None."""
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(decisions_t.c.approval_id, decisions_t.c.body).where(
                decisions_t.c.change_set_id == change_set_id, decisions_t.c.version == version,
                decisions_t.c.active.is_(True))).first()
        return (r[0], r[1]) if r is not None else None

    def active_decisions(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``{(change set id, version): decision body}`` for the active decisions of ``keys`` (one query per 500)."""
        out: dict[tuple[str, str], str] = {}
        ids = sorted({k[0] for k in keys})
        wanted = set(keys)
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                for r in conn.execute(sa.select(decisions_t.c.change_set_id, decisions_t.c.version, decisions_t.c.body).where(
                        decisions_t.c.change_set_id.in_(ids[i:i + 500]), decisions_t.c.active.is_(True))):
                    if (r[0], r[1]) in wanted:
                        out[(r[0], r[1])] = r[2]
        return out

    def decisions(self, change_set_id: str | None = None) -> list[dict]:
        """Every decision ever recorded (on one change set, or on all), newest first: ``{approval_id,
        change_set_id, version, decision, approver, method, decided_at, active, withdrawn_reason, body}``."""
        q = sa.select(decisions_t).order_by(decisions_t.c.decided_at.desc())
        if change_set_id is not None:
            q = q.where(decisions_t.c.change_set_id == change_set_id)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    def decision(self, approval_id: str) -> dict | None:
        """One decision by id (active or withdrawn), or None."""
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(decisions_t).where(decisions_t.c.approval_id == approval_id)).first()
        return dict(r._mapping) if r is not None else None

    def withdraw_decision(self, approval_id: str, reason: str) -> bool:
        """Deactivate a decision (its slot is free again for a person); True when it was active."""
        with self._tx() as conn:
            row = conn.execute(sa.select(decisions_t.c.change_set_id, decisions_t.c.version).where(
                decisions_t.c.approval_id == approval_id, decisions_t.c.active.is_(True))).first()
            if row is None:
                return False
            conn.execute(decisions_t.update().where(decisions_t.c.approval_id == approval_id).values(
                active=False, withdrawn_reason=reason[:2000]))
            conn.execute(change_sets_t.update().where(
                change_sets_t.c.change_set_id == row[0], change_sets_t.c.version == row[1],
                change_sets_t.c.state == APPROVED).values(state=PROPOSED, updated_at=time.time()))
        return True

    # -- stages ----------------------------------------------------------------------------------

    def issue_ticket(self, change_set_id: str, version: str, stage: str, approval_id: str, job_name: str,
                     expect: dict | None = None, dispatch: dict | None = None) -> str | None:
        """Issue the single ticket of a stage, good for one run of ``job_name`` whose shape is ``expect``
        (its code location and repository, partition tags, asset selection and run config, see
        :func:`dw_dagster.guard.admission.run_shape`); None when the stage was issued before (never twice).
        ``dispatch`` names the sensor evaluation that issued it (``{"location", "repository", "ticks"}``:
        only a run the daemon reserved in one of those ticks takes it; None for a ticket issued in process).

        The version must be approved, running or halted (checked and moved to running first, in the
        same transaction: a version superseded meanwhile gets no ticket).

        Raises:
            LedgerError: the version is in no state a stage may run in (superseded, applied, ...).
        """
        ticket = secrets.token_hex(16)
        try:
            with self._tx() as conn:
                live = conn.execute(change_sets_t.update().where(
                    change_sets_t.c.change_set_id == change_set_id, change_sets_t.c.version == version,
                    change_sets_t.c.state.in_(HELD_STATES)).values(state=RUNNING, updated_at=time.time())).rowcount
                if live != 1:
                    raise LedgerError(f"change set {change_set_id} version {version[:12]}… is not approved or running; "
                                      f"no ticket for stage {stage}")
                conn.execute(stages_t.insert().values(
                    change_set_id=change_set_id, version=version, stage=stage, approval_id=approval_id, ticket=ticket,
                    state=ISSUED, run_id=None, job_name=job_name, expect=json.dumps(expect, sort_keys=True) if expect else None,
                    dispatch=json.dumps(dispatch, sort_keys=True) if dispatch is not None else None,
                    issued_at=time.time(), started_at=None, finished_at=None, result=None))
        except sa.exc.IntegrityError:
            return None
        return ticket

    def note_dispatch(self, ticket: str, tick_id: str, keep: int = 10) -> bool:
        """Add a daemon tick that dispatched an issued ticket again (its run request repeated by a later
        tick) to the ticks whose reserved runs may take it (the newest ``keep``); False when a run took
        it meanwhile or it was issued in process."""
        with self._tx() as conn:
            r = conn.execute(sa.select(stages_t.c.dispatch).where(
                stages_t.c.ticket == ticket, stages_t.c.run_id.is_(None), stages_t.c.state == ISSUED)).first()
            if r is None or not r[0]:
                return False
            d = json.loads(r[0])
            ticks = [t for t in d.get("ticks") or [] if t != tick_id] + [tick_id]
            d["ticks"] = ticks[-keep:]
            return conn.execute(stages_t.update().where(stages_t.c.ticket == ticket, stages_t.c.run_id.is_(None)).values(
                dispatch=json.dumps(d, sort_keys=True))).rowcount == 1

    def stage_by_ticket(self, ticket: str) -> StageRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(stages_t).where(stages_t.c.ticket == ticket)).first()
        return _row(StageRow, r) if r is not None else None

    def stage_by_run(self, run_id: str) -> StageRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(stages_t).where(stages_t.c.run_id == run_id)).first()
        return _row(StageRow, r) if r is not None else None

    def bind_ticket(self, ticket: str, run_id: str, job_name: str, shape: dict | None = None) -> StageRow:
        """Bind an issued ticket to the run presenting it (first presenter wins); idempotent for that run.

        A ticket issued with an expected shape binds only a run of that shape (``shape`` equal to
        the ``expect`` it was issued with): a run that presents a ticket it read from a queued
        run's tags but asks for other partitions, other assets or another run config is refused.

        Raises:
            LedgerError: no such ticket (invented or copied from another deployment), it is bound
                to another run (a copied or re-executed run), its stage already ended, or the run
                is not the one the ticket was issued for (job, partitions, assets, config).
        """
        with self._tx() as conn:
            r = conn.execute(sa.select(stages_t).where(stages_t.c.ticket == ticket)).first()
            if r is None:
                raise LedgerError("the run's dw/ticket was not issued by the remediation sensor")
            row = _row(StageRow, r)
            if row.run_id == run_id:
                return row
            if row.run_id is not None:
                raise LedgerError(f"stage {row.stage} of {row.change_set_id} belongs to run {row.run_id}; a copied or "
                                  "re-executed run cannot take it (a stage runs once)")
            if row.state != ISSUED:
                raise LedgerError(f"stage {row.stage} of {row.change_set_id} is {row.state}")
            d = conn.execute(sa.select(decisions_t.c.active, decisions_t.c.withdrawn_reason).where(
                decisions_t.c.approval_id == row.approval_id)).first()
            if (d is None or not d.active) and row.stage != "receipt-halt":  # the halt receipt runs *because* it stopped
                why = f" ({d.withdrawn_reason})" if d is not None and d.withdrawn_reason else ""
                raise LedgerError(f"stage {row.stage} of {row.change_set_id} was issued under decision {row.approval_id}, "
                                  f"which no longer counts{why}")
            if row.job_name and job_name != row.job_name:
                raise LedgerError(f"the ticket of stage {row.stage} of {row.change_set_id} is for job {row.job_name}, "
                                  f"not {job_name}")
            if row.expect is not None:
                expected = json.loads(row.expect)
                differs = sorted(k for k in expected if (shape or {}).get(k) != expected[k])
                if differs:
                    raise LedgerError(f"the ticket of stage {row.stage} of {row.change_set_id} is for another run: its "
                                      f"{', '.join(differs)} differ from what the remediation sensor dispatched")
            res = conn.execute(stages_t.update().where(stages_t.c.ticket == ticket, stages_t.c.run_id.is_(None)).values(
                run_id=run_id, state=STARTED, started_at=time.time()))
            if res.rowcount != 1:  # lost a race with another presenter
                raise LedgerError(f"stage {row.stage} of {row.change_set_id} was taken by another run")
            r = conn.execute(sa.select(stages_t).where(stages_t.c.ticket == ticket)).one()
        return _row(StageRow, r)

    def complete_stage(self, ticket: str, run_id: str, *, success: bool, result: dict | None = None,
                       state: str | None = None) -> bool:
        """Record the end of a stage by the run bound to it; True when it moved (only once)."""
        final = state or (SUCCEEDED if success else STAGE_FAILED)
        with self._tx() as conn:
            before = conn.execute(sa.select(stages_t.c.result).where(stages_t.c.ticket == ticket)).scalar()
            attempts = _attempts(before)
            body = {**(result or {}), **({"attempts": attempts} if attempts > 1 else {})}
            res = conn.execute(stages_t.update().where(
                stages_t.c.ticket == ticket, stages_t.c.run_id == run_id, stages_t.c.state == STARTED).values(
                state=final, finished_at=time.time(), result=json.dumps(body, default=str)))
            return res.rowcount == 1

    def reissue_ticket(self, ticket: str, run_id: str, *, count: bool = False, why: str = "") -> str | None:
        """Give a stage a fresh ticket when the run bound to it never executed a step (cancelled while
        queued by an org-wide stop; its worker or the daemon killed before the first step; its start
        timed out): nothing ran, so running it again replays nothing. Returns the new ticket, or None
        when the stage is not bound to ``run_id`` any more. With ``count``, the attempt is counted in the
        stage's result (``attempts``, ``earlier``: why each earlier run ended)."""
        new = secrets.token_hex(16)
        with self._tx() as conn:
            before = conn.execute(sa.select(stages_t.c.result).where(stages_t.c.ticket == ticket)).scalar()
            values: dict[str, Any] = dict(ticket=new, run_id=None, state=ISSUED, started_at=None, issued_at=time.time(),
                                          dispatch=_no_ticks(conn, ticket))
            if count:
                earlier = json.loads(before).get("earlier", []) if before else []
                values["result"] = json.dumps({"attempts": _attempts(before) + 1,
                                               "earlier": [*earlier, {"run_id": run_id, "why": why}][-10:]})
            res = conn.execute(stages_t.update().where(
                stages_t.c.ticket == ticket, stages_t.c.run_id == run_id, stages_t.c.state == STARTED).values(**values))
            return new if res.rowcount == 1 else None

    def rotate_ticket(self, ticket: str) -> str | None:
        """Replace an issued ticket no run took (shown by a dry run of the sensor, or its run key taken by
        another run): the old one is dead, the stage gets a new one (and a new run key). None when a run
        took it meanwhile."""
        new = secrets.token_hex(16)
        with self._tx() as conn:
            res = conn.execute(stages_t.update().where(
                stages_t.c.ticket == ticket, stages_t.c.run_id.is_(None), stages_t.c.state == ISSUED).values(
                ticket=new, issued_at=time.time(), dispatch=_no_ticks(conn, ticket)))
            return new if res.rowcount == 1 else None

    def revoke_ticket(self, ticket: str) -> bool:
        """Take back an issued ticket no run took (its decision stopped counting): the stage row goes,
        so nothing can present the ticket, and a later approval issues the stage anew. False when a
        run took it meanwhile."""
        with self._tx() as conn:
            res = conn.execute(stages_t.delete().where(
                stages_t.c.ticket == ticket, stages_t.c.run_id.is_(None), stages_t.c.state == ISSUED))
            return res.rowcount == 1

    def retry_stage(self, ticket: str, max_attempts: int = 3) -> str | None:
        """Issue a stage that ended without its own code completing it (its run was terminated or
        crashed) once more, with a new ticket: only for stages that change no data (the receipt).

        Returns:
            The new ticket, or None when the stage is not failed/abandoned any more or has been tried
            ``max_attempts`` times (the attempts are counted in its result).
        """
        new = secrets.token_hex(16)
        with self._tx() as conn:
            r = conn.execute(sa.select(stages_t).where(stages_t.c.ticket == ticket)).first()
            if r is None or r.state not in (STAGE_FAILED, ABANDONED):
                return None
            earlier = json.loads(r.result) if r.result else {}
            attempts = int(earlier.get("attempts", 1)) if isinstance(earlier, dict) else 1
            if attempts >= max_attempts:
                return None
            res = conn.execute(stages_t.update().where(stages_t.c.ticket == ticket, stages_t.c.state == r.state).values(
                ticket=new, run_id=None, state=ISSUED, started_at=None, finished_at=None, issued_at=time.time(),
                result=json.dumps({"attempts": attempts + 1, "earlier": earlier}), dispatch=_no_ticks(conn, ticket)))
            return new if res.rowcount == 1 else None

    def abandon_stage(self, ticket: str, reason: str) -> bool:
        """Mark an issued or started stage abandoned (its run vanished or ended without completing); the
        attempts counted in its result stay counted (:meth:`retry_stage`'s limit)."""
        with self._tx() as conn:
            attempts = _attempts(conn.execute(sa.select(stages_t.c.result).where(stages_t.c.ticket == ticket)).scalar())
            res = conn.execute(stages_t.update().where(stages_t.c.ticket == ticket,
                                                       stages_t.c.state.in_([ISSUED, STARTED])).values(
                state=ABANDONED, finished_at=time.time(),
                result=json.dumps({"reason": reason, **({"attempts": attempts} if attempts > 1 else {})})))
            return res.rowcount == 1

    def stages(self, change_set_id: str, version: str) -> dict[str, StageRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(stages_t).where(stages_t.c.change_set_id == change_set_id,
                                                          stages_t.c.version == version))
            return {r.stage: _row(StageRow, r) for r in rows}

    def stages_of_many(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, StageRow]]:
        """Stages of several versions at once (one query per 500 change sets)."""
        out: dict[tuple[str, str], dict[str, StageRow]] = {k: {} for k in keys}
        ids = sorted({k[0] for k in keys})
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                for r in conn.execute(sa.select(stages_t).where(stages_t.c.change_set_id.in_(ids[i:i + 500]))):
                    if (r.change_set_id, r.version) in out:
                        out[(r.change_set_id, r.version)][r.stage] = _row(StageRow, r)
        return out

    def open_windows(self, asset_key: str | None = None) -> list[ChangeSetRow]:
        """Change set versions whose window is held (:data:`HELD_STATES`: approved, running, halted), on
        ``asset_key`` or on every asset, whether or not a newer version was recorded meanwhile."""
        return self.change_set_rows(states=HELD_STATES, target_asset=asset_key, latest_only=False)

    # -- receipts --------------------------------------------------------------------------------

    def receipt_head(self, asset_key: str) -> tuple[int, str] | None:
        """``(seq, hash)`` of the newest receipt of ``asset_key``, or None."""
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(receipt_heads_t.c.seq, receipt_heads_t.c.hash).where(
                receipt_heads_t.c.asset_key == asset_key)).first()
        return (r[0], r[1]) if r is not None else None

    def append_receipt(self, *, asset_key: str, expected_head: tuple[int, str] | None, receipt_id: str, hash: str,
                       previous_hash: str | None, change_set_id: str, run_id: str | None) -> bool:
        """Append a receipt to its asset's chain if the head is still ``expected_head`` (compare-and-set).

        Returns False when another writer moved the head first (rebuild the receipt on the new head).
        """
        seq = (expected_head[0] + 1) if expected_head else 1
        try:
            with self._tx() as conn:
                if expected_head is None:
                    conn.execute(receipt_heads_t.insert().values(asset_key=asset_key, seq=seq, hash=hash))
                else:
                    res = conn.execute(receipt_heads_t.update().where(
                        receipt_heads_t.c.asset_key == asset_key, receipt_heads_t.c.seq == expected_head[0],
                        receipt_heads_t.c.hash == expected_head[1]).values(seq=seq, hash=hash))
                    if res.rowcount != 1:
                        raise _Lost()
                conn.execute(receipts_t.insert().values(
                    asset_key=asset_key, seq=seq, receipt_id=receipt_id, hash=hash, previous_hash=previous_hash,
                    change_set_id=change_set_id, run_id=run_id, created_at=time.time()))
        except (_Lost, sa.exc.IntegrityError):
            return False
        return True

    def receipt_links(self, asset_key: str | None = None) -> list[ReceiptLink]:
        """The chain(s) as recorded, oldest first per asset."""
        q = sa.select(receipts_t).order_by(receipts_t.c.asset_key, receipts_t.c.seq)
        if asset_key is not None:
            q = q.where(receipts_t.c.asset_key == asset_key)
        with self.engine.connect() as conn:
            return [_row(ReceiptLink, r) for r in conn.execute(q)]

    def receipt_heads(self) -> dict[str, tuple[int, str]]:
        with self.engine.connect() as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute(sa.select(receipt_heads_t))}

    def receipted_change_sets(self, asset_key: str) -> set[str]:
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(receipts_t.c.change_set_id).where(
                receipts_t.c.asset_key == asset_key))}

    # -- control, audit, quarantine --------------------------------------------------------------

    def control(self, key: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(control_t.c.body).where(control_t.c.key == key)).first()
        return json.loads(r[0]) if r is not None else None

    def set_control(self, key: str, body: dict) -> None:
        text = json.dumps(body, default=str)
        with self._tx() as conn:
            if conn.execute(control_t.update().where(control_t.c.key == key).values(
                    body=text, updated_at=time.time())).rowcount == 0:
                conn.execute(control_t.insert().values(key=key, body=text, updated_at=time.time()))

    def audit(self, kind: str, subject: str, by: str, body: dict) -> None:
        """Append one audit entry (incident closed, hold lifted, stop resumed ...)."""
        with self._tx() as conn:
            conn.execute(audit_t.insert().values(kind=kind, subject=subject, by=by, at=time.time(),
                                                 body=json.dumps(body, default=str)))

    def audit_entries(self, kind: str | None = None, subject: str | None = None) -> list[dict]:
        q = sa.select(audit_t).order_by(audit_t.c.id.desc())
        if kind is not None:
            q = q.where(audit_t.c.kind == kind)
        if subject is not None:
            q = q.where(audit_t.c.subject == subject)
        with self.engine.connect() as conn:
            return [{**dict(r._mapping), "body": json.loads(r.body)} for r in conn.execute(q)]

    def quarantine(self, ref: str, kind: str, asset_key: str, reason: str) -> bool:
        """Note a malformed or tampered record (once per ref; ``last_seen`` updated); True the first time."""
        now = time.time()
        with self._tx() as conn:
            if conn.execute(quarantine_t.update().where(quarantine_t.c.ref == ref).values(
                    last_seen=now, reason=reason[:4000])).rowcount == 0:
                conn.execute(quarantine_t.insert().values(ref=ref, kind=kind, asset_key=asset_key, reason=reason[:4000],
                                                          first_seen=now, last_seen=now))
                return True
        return False

    def quarantined(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(quarantine_t).order_by(quarantine_t.c.first_seen))]


class _Lost(Exception):
    pass


def _attempts(result_text: str | None) -> int:
    """How many runs a stage has had, from its result (``attempts``; 1 when not counted)."""
    try:
        n = json.loads(result_text).get("attempts", 1) if result_text else 1
        return int(n) if isinstance(n, (int, float, str)) and str(n).isdigit() else 1
    except (ValueError, AttributeError):
        return 1


def _no_ticks(conn, ticket: str) -> str | None:
    """The ``dispatch`` of ``ticket``'s stage with no tick yet: a new ticket is taken only by a run
    reserved in a tick that dispatches *it* (its location and repository stay)."""
    r = conn.execute(sa.select(stages_t.c.dispatch).where(stages_t.c.ticket == ticket)).first()
    if r is None or not r[0]:
        return None
    d = json.loads(r[0])
    d["ticks"] = []
    return json.dumps(d, sort_keys=True)


wrap_public_methods(Ledger)  # every call rides out a short storage outage (ledger_outage)


# -- opening the ledger of an instance ---------------------------------------------------------------

_engines: dict[str, Ledger] = {}
_ephemeral: "weakref.WeakKeyDictionary[Any, Ledger]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@public
def ledger_for(instance: Any) -> Ledger:
    """The ledger of a Dagster instance (see the module docstring), opened once per process.

    Raises:
        LedgerError: the instance's storage is of a kind the ledger cannot share (e.g. a custom
            run storage without a SQL URL), or the database refuses the tables.
    """
    url = ledger_url(instance)
    with _lock:
        if url is None:
            from dw_dagster.dagster_private import InMemoryRunStorage

            if not isinstance(instance.run_storage, InMemoryRunStorage):
                raise LedgerError(f"cannot place dw_dagster's ledger next to run storage {type(instance.run_storage).__name__}: "
                                  "use Dagster's SQLite or PostgreSQL storage")
            led = _ephemeral.get(instance)
            if led is None:
                engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool,
                                          connect_args={"check_same_thread": False})
                led = _ephemeral[instance] = Ledger(engine, url="sqlite:// (in memory)")
            return led
        led = _engines.get(url)
        if led is None:
            if url.startswith("sqlite"):
                engine = _sqlite_engine(url)
            else:
                engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
            led = _engines[url] = Ledger(engine, url=url)
        return led


__all__ = [
    "ACTIVE_STATES", "APPLIED", "APPROVED", "ChangeSetRow", "ENDED_STATES", "EXPIRED", "FAILED", "HALTED", "HELD_STATES",
    "IncidentRow", "Ledger", "UNREPAIRED",
    "LedgerError", "PROPOSED", "REJECTED", "ReceiptLink", "RUNNING", "StageRow", "SUPERSEDED", "asset_str", "ledger_for",
    "ledger_url",
]
