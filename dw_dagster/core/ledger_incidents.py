"""The ledger's incidents: one row per incident, and at most one open (unlinked) incident per asset.

Part of :class:`dw_dagster.core.ledger.Ledger` (its module docstring tells where the ledger lives).
A detector that finds a problem on an asset records an incident *unless* one is already open on
that asset (:meth:`IncidentsMixin.record_incident_unless_open`). The look and the insert are one
transaction that holds a lock on the asset first:

- SQLite: the ledger's transactions begin with ``BEGIN IMMEDIATE`` (the database's write lock);
- PostgreSQL: ``pg_advisory_xact_lock`` on a hash of the asset key (other assets are not held up),
  in a read-committed transaction whatever the database's default isolation (under repeatable
  read the look would see the snapshot taken before the lock was granted).

So two processes that see the same drop at the same moment (two replicas of a code location, a
"Test sensor" evaluation beside the daemon's tick) open one incident between them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from dw_dagster.core.ledger_tables import IncidentRow, _row, incidents_t

#: incident states
OPEN, DIAGNOSING, DIAGNOSED, DIAGNOSIS_FAILED, REDIAGNOSE, CLOSED, QUARANTINED = (
    "open", "diagnosing", "diagnosed", "diagnosis_failed", "rediagnose", "closed", "quarantined")
#: a diagnosed incident whose change set ended without a proven repair (rejected, expired, the repair
#: failed or did not verify) and no other version is live: diagnosed again on new evidence
UNREPAIRED = "unrepaired"
OPEN_INCIDENT_STATES = (OPEN, DIAGNOSING, DIAGNOSED, DIAGNOSIS_FAILED, REDIAGNOSE, UNREPAIRED)
#: incidents per transaction of :meth:`IncidentsMixin.record_incidents_unless_open` (and advisory locks held at once)
BATCH = 200
#: assets per look (bound parameters per statement)
LOOK_CHUNK = 500
_ITEM_KEYS = ("incident_id", "asset_key", "source", "external_id", "body")


def _lock_name(asset_key: str) -> str:
    """The text whose ``hashtext`` keys an asset's advisory lock on PostgreSQL."""
    return f"dw_incident:{asset_key}"


def _pending_row(values: Mapping[str, Any]) -> IncidentRow:
    """The row an insert of ``values`` makes (what a later item of the same batch finds open on its asset)."""
    return IncidentRow(**{f: values.get(f) for f in IncidentRow.__dataclass_fields__})


class IncidentsMixin:
    """The incident methods of :class:`~dw_dagster.core.ledger.Ledger` (``engine`` and ``_tx`` are its)."""

    engine: sa.engine.Engine

    def _tx(self):  # pragma: no cover - Ledger's
        raise NotImplementedError



    def record_incident(self, *, incident_id: str, asset_key: str, source: str, external_id: str | None, body: str,
                        state: str = OPEN, linked_to: str | None = None) -> bool:
        """Record an incident once; False when the id (or the source's external id) is known already."""
        try:
            with self._tx() as conn:
                return self._insert_incident(conn, incident_id=incident_id, asset_key=asset_key, source=source,
                                             external_id=external_id, body=body, state=state, linked_to=linked_to)
        except sa.exc.IntegrityError:
            return False

    def record_incident_unless_open(self, *, incident_id: str, asset_key: str, source: str, external_id: str | None,
                                    body: str, link: bool = False) -> tuple[bool, IncidentRow | None]:
        """Record an incident unless one is open on its asset: the look and the insert in one transaction.

        The transaction holds the asset's lock first (module docstring), so of two processes that
        record an incident on the same asset at the same moment, the second finds the first's.

        Args:
            incident_id, asset_key, source, external_id, body: as :meth:`record_incident`.
            link: when an incident is open on the asset, record this one linked to it (``True``, a
                second alert about the same problem) or not at all (``False``).

        Returns:
            ``(recorded, open_incident)``: whether this incident was recorded, and the open unlinked
            incident found on the asset (None when there was none). ``recorded`` is also False when
            the id or the source's external id is known already.
        """
        try:
            with self._tx() as conn:
                if conn.dialect.name == "postgresql":
                    # read committed whatever the database's default: under repeatable read the look would
                    # read the snapshot taken before the lock was granted, missing the incident just recorded
                    conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(_lock_name(asset_key)))))
                found = self._open_incident(conn, asset_key)
                if found is not None and not link:
                    return False, found
                return self._insert_incident(conn, incident_id=incident_id, asset_key=asset_key, source=source,
                                             external_id=external_id, body=body, state=OPEN,
                                             linked_to=found.incident_id if found is not None else None), found
        except sa.exc.IntegrityError:  # the same id recorded at the same moment by another process
            return False, self.open_incident(asset_key)

    def record_incidents_unless_open(self, items: Sequence[Mapping[str, Any]]) -> list[tuple[bool, IncidentRow | None]]:
        """:meth:`record_incident_unless_open` for many incidents (a sensor tick's anomalies), in few transactions.

        An item whose asset has an open incident at a first plain read (no lock, as a look before
        :meth:`record_incident_unless_open` would be) finds it; the others are recorded in one
        transaction per :data:`BATCH` items (PostgreSQL keeps every advisory lock of a
        transaction in a shared table of ``max_locks_per_transaction`` × connections slots: a
        warehouse-wide reload that makes 50,000 tables anomalous at once would run out of it). Each
        holds its items' asset locks first: on PostgreSQL one advisory lock per asset, taken in the
        order of the locks' keys, so two batches (or a batch and a single call) never wait on each
        other in a cycle. Then one look for the assets and one insert for the incidents to record.
        When two items name the same asset, only the first is recorded; the others find it open.
        Should another process record the same id at the same moment, that transaction rolls back
        and each of its items is recorded on its own.

        Args:
            items: mappings with the keyword arguments of :meth:`record_incident_unless_open`
                (``incident_id``, ``asset_key``, ``source``, ``external_id``, ``body``); ``link``
                is False for all.

        Returns:
            ``(recorded, open_incident)`` per item, in order, as :meth:`record_incident_unless_open` returns.
        """
        with self.engine.connect() as conn:  # a plain read first: most anomalies of a tick find theirs still open
            found = self._open_incidents(conn, sorted({it["asset_key"] for it in items}))
        out: list[tuple[bool, IncidentRow | None]] = [(False, found.get(it["asset_key"])) for it in items]
        rest = [i for i, it in enumerate(items) if it["asset_key"] not in found]
        for start in range(0, len(rest), BATCH):
            chunk = rest[start:start + BATCH]
            try:
                with self._tx() as conn:
                    results = self._record_batch(conn, [items[i] for i in chunk])
            except sa.exc.IntegrityError:  # an id recorded at the same moment by another process: one by one
                results = [self.record_incident_unless_open(**{k: items[i][k] for k in _ITEM_KEYS}) for i in chunk]
            for i, result in zip(chunk, results):
                out[i] = result
        return out

    @classmethod
    def _record_batch(cls, conn: Any, items: Sequence[Mapping[str, Any]]) -> list[tuple[bool, IncidentRow | None]]:
        keys = sorted({it["asset_key"] for it in items})
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            # one statement, the locks taken in key order (PostgreSQL evaluates a volatile output
            # expression after the ORDER BY's sort)
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtext(k) AS h "
                                 "FROM unnest(CAST(:keys AS text[])) AS u(k)) AS locks ORDER BY h"),
                         {"keys": [_lock_name(k) for k in keys]}).all()
        found = cls._open_incidents(conn, keys)
        out: list[tuple[bool, IncidentRow | None]] = []
        now, rows, externals = time.time(), [], set()
        for it in items:
            existing, external = found.get(it["asset_key"]), (it["source"], it["external_id"])
            if existing is not None or (it["external_id"] is not None
                                        and (external in externals or cls._known_external(conn, it))):
                out.append((False, existing))
                continue
            externals.add(external)
            rows.append({**{k: it[k] for k in _ITEM_KEYS}, "state": OPEN, "linked_to": None, "opened_at": now,
                         "updated_at": now, "attempts": 0, "note": ""})
            found[it["asset_key"]] = _pending_row(rows[-1])
            out.append((True, None))
        if rows:
            conn.execute(incidents_t.insert(), rows)
        return out

    @staticmethod
    def _open_incidents(conn: Any, asset_keys: Sequence[str]) -> dict[str, IncidentRow]:
        """Asset key → its newest open unlinked incident, for those of ``asset_keys`` that have one."""
        out: dict[str, IncidentRow] = {}
        for start in range(0, len(asset_keys), LOOK_CHUNK):
            q = sa.select(incidents_t).where(
                incidents_t.c.asset_key.in_(asset_keys[start:start + LOOK_CHUNK]),
                incidents_t.c.state.in_(OPEN_INCIDENT_STATES), incidents_t.c.linked_to.is_(None)
            ).order_by(incidents_t.c.opened_at.desc())
            for r in conn.execute(q):
                out.setdefault(r.asset_key, _row(IncidentRow, r))
        return out

    @staticmethod
    def _known_external(conn: Any, item: Mapping[str, Any]) -> bool:
        return conn.execute(sa.select(incidents_t.c.incident_id).where(
            incidents_t.c.source == item["source"], incidents_t.c.external_id == item["external_id"])).first() is not None

    @staticmethod
    def _insert_incident(conn: Any, *, incident_id: str, asset_key: str, source: str, external_id: str | None,
                         body: str, state: str, linked_to: str | None) -> bool:
        if external_id is not None and conn.execute(sa.select(incidents_t.c.incident_id).where(
                incidents_t.c.source == source, incidents_t.c.external_id == external_id)).first() is not None:
            return False
        now = time.time()
        conn.execute(incidents_t.insert().values(
            incident_id=incident_id, asset_key=asset_key, source=source, external_id=external_id, state=state,
            linked_to=linked_to, opened_at=now, updated_at=now, attempts=0, note="", body=body))
        return True

    def incident(self, incident_id: str) -> IncidentRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(incidents_t).where(incidents_t.c.incident_id == incident_id)).first()
        return _row(IncidentRow, r) if r is not None else None

    def incident_by_external(self, source: str, external_id: str) -> IncidentRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(incidents_t).where(incidents_t.c.source == source,
                                                          incidents_t.c.external_id == external_id)).first()
        return _row(IncidentRow, r) if r is not None else None

    def incidents(self, *, asset_key: str | None = None, states: Iterable[str] | None = None,
                  linked_to: str | None = None, limit: int | None = None) -> list[IncidentRow]:
        """Incidents, newest first, filtered on indexed columns."""
        q = sa.select(incidents_t)
        if asset_key is not None:
            q = q.where(incidents_t.c.asset_key == asset_key)
        if states is not None:
            q = q.where(incidents_t.c.state.in_(list(states)))
        if linked_to is not None:
            q = q.where(incidents_t.c.linked_to == linked_to)
        q = q.order_by(incidents_t.c.opened_at.desc())
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_row(IncidentRow, r) for r in conn.execute(q)]

    def open_incident(self, asset_key: str) -> IncidentRow | None:
        """The newest incident on ``asset_key`` that is not closed and not linked to another."""
        with self.engine.connect() as conn:
            return self._open_incident(conn, asset_key)

    @staticmethod
    def _open_incident(conn: Any, asset_key: str) -> IncidentRow | None:
        r = conn.execute(sa.select(incidents_t).where(
            incidents_t.c.asset_key == asset_key, incidents_t.c.state.in_(OPEN_INCIDENT_STATES),
            incidents_t.c.linked_to.is_(None)).order_by(incidents_t.c.opened_at.desc()).limit(1)).first()
        return _row(IncidentRow, r) if r is not None else None

    def set_incident_state(self, incident_id: str, state: str, *, from_states: Iterable[str] | None = None,
                           note: str | None = None, attempts_delta: int = 0, linked_to: str | None | type = ...) -> bool:
        q = incidents_t.update().where(incidents_t.c.incident_id == incident_id)
        if from_states is not None:
            q = q.where(incidents_t.c.state.in_(list(from_states)))
        values: dict[str, Any] = {"state": state, "updated_at": time.time()}
        if note is not None:
            values["note"] = note[:4000]
        if attempts_delta:
            values["attempts"] = incidents_t.c.attempts + attempts_delta
        if linked_to is not ...:
            values["linked_to"] = linked_to
        with self._tx() as conn:
            return conn.execute(q.values(**values)).rowcount == 1

