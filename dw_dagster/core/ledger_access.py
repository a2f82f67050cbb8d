"""The ledger's access requests: one row per request, its state moved by compare-and-set only.

Part of :class:`dw_dagster.core.ledger.Ledger`. The states (:mod:`dw_dagster.access` moves them):

``draft`` (the requester is not verified yet) → ``pending`` (waiting for every domain's owners)
→ ``approved`` → ``granting`` (the grant run holds its ticket) → ``active`` → ``revoking`` (a
revoke run holds its ticket) → ``revoked``. A revoke that fails goes to ``revoke_failed`` and is
tried again at ``next_revoke_at``; a grant that fails goes to ``grant_failed`` and is revoked (what
ran of it is taken back). ``rejected``, ``expired`` and ``cancelled`` end a request that was never
granted; ``superseded`` ends an active grant an approved extension took over.

Every move names the states it may come from, so two daemons, a restart or a re-executed run can
never move a request twice: the reminder is claimed once (``reminder_claimed_at`` from NULL), each
revoke attempt is a stage of its own in the ledger's stage table (one ticket, one run).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from dw_dagster.core.ledger_tables import AccessRow, _row, access_t

DRAFT, PENDING, APPROVED, GRANTING, ACTIVE = "draft", "pending", "approved", "granting", "active"
REVOKING, REVOKED, REVOKE_FAILED, GRANT_FAILED = "revoking", "revoked", "revoke_failed", "grant_failed"
REJECTED, EXPIRED, CANCELLED, SUPERSEDED = "rejected", "expired", "cancelled", "superseded"
#: the grant may be in force: the revoke must still happen
HOLDING = (GRANTING, ACTIVE, REVOKING, REVOKE_FAILED, GRANT_FAILED)
#: waiting for people or for the grant
WAITING = (DRAFT, PENDING, APPROVED)
ENDED = (REVOKED, REJECTED, EXPIRED, CANCELLED, SUPERSEDED)


class AccessMixin:
    """The access methods of :class:`~dw_dagster.core.ledger.Ledger` (``engine`` and ``_tx`` are its)."""

    engine: sa.engine.Engine

    def _tx(self):  # pragma: no cover - Ledger's
        raise NotImplementedError

    def record_access(self, *, request_id: str, state: str, grantee: str, requested_by: str, database: str,
                      content_key: str, requested_at: float, expires_at: float, body: str) -> tuple[AccessRow, bool]:
        """Record a request once; the same content while a request of it waits returns that one (False)."""
        now = time.time()
        with self._tx() as conn:
            same = conn.execute(sa.select(access_t).where(access_t.c.content_key == content_key,
                                                          access_t.c.state.in_(WAITING))).first()
            if same is not None:
                return _row(AccessRow, same), False
            conn.execute(access_t.insert().values(
                request_id=request_id, state=state, grantee=grantee, requested_by=requested_by, database=database,
                content_key=content_key, requested_at=requested_at, expires_at=expires_at, updated_at=now,
                revoke_attempts=0, note="", body=body, result="{}"))
            row = conn.execute(sa.select(access_t).where(access_t.c.request_id == request_id)).one()
        return _row(AccessRow, row), True

    def access_row(self, request_id: str) -> AccessRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(access_t).where(access_t.c.request_id == request_id)).first()
        return _row(AccessRow, r) if r is not None else None

    def access_rows(self, *, states: Iterable[str] | None = None, grantee: str | None = None,
                    due_before: float | None = None, limit: int | None = None) -> list[AccessRow]:
        """Requests, newest first, filtered on indexed columns (``due_before``: ``expires_at`` at or before it)."""
        q = sa.select(access_t)
        if states is not None:
            q = q.where(access_t.c.state.in_(list(states)))
        if grantee is not None:
            q = q.where(access_t.c.grantee == grantee)
        if due_before is not None:
            q = q.where(access_t.c.expires_at <= due_before)
        q = q.order_by(access_t.c.requested_at.desc())
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_row(AccessRow, r) for r in conn.execute(q)]

    def move_access(self, request_id: str, to: str, *, from_states: Iterable[str], note: str | None = None,
                    result: dict[str, Any] | None = None, **fields: Any) -> bool:
        """Move a request to ``to`` only from ``from_states`` (compare-and-set); True when it moved.

        ``result`` is merged into the stored result; other keyword fields (``granted_at``,
        ``revoked_at``, ``next_revoke_at``, ``incident_id``, ``revoke_attempts``, ``body``) are set.
        """
        allowed = {"granted_at", "revoked_at", "next_revoke_at", "incident_id", "revoke_attempts", "body",
                   "reminder_claimed_at", "reminded_at"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"not an access field: {sorted(bad)}")
        with self._tx() as conn:
            cur = conn.execute(sa.select(access_t.c.result, access_t.c.state).where(
                access_t.c.request_id == request_id)).first()
            if cur is None or cur.state not in set(from_states):
                return False
            values: dict[str, Any] = {"state": to, "updated_at": time.time(), **fields}
            if note is not None:
                values["note"] = note[:4000]
            if result:
                merged = {**(json.loads(cur.result) if cur.result else {}), **result}
                values["result"] = json.dumps(merged, default=str)
            res = conn.execute(access_t.update().where(access_t.c.request_id == request_id,
                                                       access_t.c.state == cur.state).values(**values))
            return res.rowcount == 1

    def claim_reminder(self, request_id: str) -> bool:
        """Take the request's one reminder (True once, whoever asks first)."""
        with self._tx() as conn:
            res = conn.execute(access_t.update().where(access_t.c.request_id == request_id,
                                                       access_t.c.reminder_claimed_at.is_(None)).values(
                reminder_claimed_at=time.time(), updated_at=time.time()))
            return res.rowcount == 1

    def finish_reminder(self, request_id: str, sent: bool, detail: dict[str, Any]) -> None:
        """Record the reminder sent, or free the claim so the next tick tries again."""
        with self._tx() as conn:
            cur = conn.execute(sa.select(access_t.c.result).where(access_t.c.request_id == request_id)).scalar()
            merged = {**(json.loads(cur) if cur else {}), "reminder": detail}
            values: dict[str, Any] = {"result": json.dumps(merged, default=str), "updated_at": time.time()}
            if sent:
                values["reminded_at"] = time.time()
            else:
                values["reminder_claimed_at"] = None
            conn.execute(access_t.update().where(access_t.c.request_id == request_id).values(**values))


__all__ = ["ACTIVE", "APPROVED", "AccessMixin", "CANCELLED", "DRAFT", "ENDED", "EXPIRED", "GRANTING", "GRANT_FAILED",
           "HOLDING", "PENDING", "REJECTED", "REVOKED", "REVOKE_FAILED", "REVOKING", "SUPERSEDED", "WAITING"]
