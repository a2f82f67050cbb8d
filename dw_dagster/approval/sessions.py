"""Server-side sessions for the review page (and any page the approvals server adds).

The browser holds only an opaque session id in a cookie; everything else lives on the server, in
the ledger's database (table ``dw_ledger_sessions``, next to the decisions it guards), so:

- **logout ends it everywhere**: ``POST /logout`` deletes the row, and every copy of the cookie
  (another tab, a copy saved before logging out, one read by another server) points at nothing;
- **it survives a restart** of the approvals server, and several replicas share it;
- **it expires**: a login lasts :data:`SESSION_SECONDS` from the moment the identity provider
  vouched for the person (absolute, not sliding), a login in progress :data:`LOGIN_SECONDS`;
- **the CSRF token is not derivable from the cookie**: it is a separate random value stored with
  the session and written only into the pages the server renders; a stolen cookie without a page
  of the session decides nothing;
- **the session belongs to one server**: each row records the origin (``scheme://host:port``)
  of the server that made it; a server with another base URL (another port of the same host, where
  browsers send the same cookies) finds no session for it;
- the table holds the SHA-256 of each id, not the id: whoever reads the database cannot log in.

The cookie is ``HttpOnly``, ``SameSite=Lax``, ``Path=/``, without ``Domain``; behind HTTPS (an
``https://`` base URL) it is ``Secure`` and named with the ``__Host-`` prefix, which browsers only
accept from a secure origin without ``Domain``, so no sibling subdomain can set or overwrite it.
Deploy the approvals server on a host name of its own (``approvals.example.com``): cookies are not
isolated by port, so any other service on the same host name could receive them.

:class:`ReviewSessions` is the whole interface a page needs: :meth:`~ReviewSessions.current` (who is
logged in, or None), :meth:`~ReviewSessions.csrf_ok`, and the login / logout steps.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from dw_dagster.core.extras import missing_extra

try:
    from starlette.requests import Request
    from starlette.responses import Response
except ImportError as _e:  # an optional surface: its extra
    raise missing_extra("review", _e) from _e

from dw_dagster.core.ledger import Ledger
from dw_dagster.core.ledger_tables import sessions_t

SESSION_SECONDS = 15 * 60
LOGIN_SECONDS = 10 * 60  # a login started must come back within this
COOKIE = "dw_review"
SECURE_COOKIE = "__Host-dw_review"
LOGIN, SESSION = "login", "session"


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    """A logged-in person: ``email``, the identity provider's ``iss`` and ``sub``, the ID token's
    credential id ``cred``, when they logged in (``at``), the session's ``csrf`` token, its end (``until``)."""

    email: str
    iss: str
    sub: str
    cred: str
    at: float
    csrf: str
    until: float

    def __getitem__(self, key: str) -> Any:  # the page templates read it like a mapping
        return getattr(self, key)


class ReviewSessions:
    """The sessions of one approvals server (module docstring).

    Args:
        ledger: the ledger whose database holds the sessions, or a callable returning it (called
            when first needed).
        base_url: the server's public URL; its origin binds the sessions it makes, ``https://``
            makes the cookie ``Secure`` and ``__Host-`` prefixed.
        session_seconds: how long a login lasts.
    """

    def __init__(self, ledger: Ledger | Callable[[], Ledger], base_url: str, *,
                 session_seconds: float = SESSION_SECONDS) -> None:
        self._ledger = ledger if isinstance(ledger, Ledger) else None
        self._factory = None if self._ledger is not None else ledger
        parts = urlsplit(base_url.rstrip("/"))
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.secure = parts.scheme == "https"
        self.cookie_name = SECURE_COOKIE if self.secure else COOKIE
        self.session_seconds = session_seconds

    @property
    def engine(self) -> sa.engine.Engine:
        if self._ledger is None:
            self._ledger = self._factory()
        return self._ledger.engine

    # -- the cookie ------------------------------------------------------------------------------

    def _id(self, request: Request) -> str | None:
        value = request.cookies.get(self.cookie_name)
        return value if value and 20 <= len(value) <= 100 else None

    def _set_cookie(self, response: Response, session_id: str, max_age: float) -> None:
        response.set_cookie(self.cookie_name, session_id, max_age=int(max_age), path="/", httponly=True,
                            samesite="lax", secure=self.secure)

    def clear_cookie(self, response: Response) -> None:
        """Tell the browser to drop the cookie (the server-side row is what ends the session)."""
        response.delete_cookie(self.cookie_name, path="/", httponly=True, samesite="lax", secure=self.secure)

    # -- rows ------------------------------------------------------------------------------------

    def _row(self, session_id: str | None, kind: str):
        if session_id is None:
            return None
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(sessions_t).where(sessions_t.c.id_hash == _hash(session_id))).first()
        if r is None or r.kind != kind or r.origin != self.origin:  # another server's session is no session here
            return None
        if r.expires_at <= time.time():
            self._delete(session_id)
            return None
        return r

    def _insert(self, kind: str, data: Mapping[str, Any], *, email: str | None, csrf: str | None, seconds: float) -> str:
        session_id = secrets.token_urlsafe(32)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(sessions_t.delete().where(sessions_t.c.expires_at <= now))  # the expired ones, whoever's
            conn.execute(sessions_t.insert().values(id_hash=_hash(session_id), origin=self.origin, kind=kind, email=email,
                                                    csrf=csrf, data=json.dumps(dict(data)), created_at=now,
                                                    expires_at=now + seconds))
        return session_id

    def _delete(self, session_id: str) -> bool:
        with self.engine.begin() as conn:
            return conn.execute(sessions_t.delete().where(sessions_t.c.id_hash == _hash(session_id))).rowcount == 1

    # -- what pages use ----------------------------------------------------------------------------

    def current(self, request: Request) -> Session | None:
        """The person logged in with this request's cookie, or None (no cookie, logged out, expired,
        or a session of another server)."""
        r = self._row(self._id(request), SESSION)
        if r is None:
            return None
        d = json.loads(r.data)
        return Session(email=r.email, iss=d.get("iss", ""), sub=d.get("sub", ""), cred=d.get("cred", ""),
                       at=float(d.get("at", r.created_at)), csrf=r.csrf, until=r.expires_at)

    @staticmethod
    def csrf_ok(session: Session, sent: str | None) -> bool:
        """Whether a form's ``csrf`` field is this session's token (compared in constant time)."""
        return bool(sent) and hmac.compare_digest(sent.encode(), session.csrf.encode())

    def begin_login(self, response: Response, pending: Mapping[str, Any]) -> None:
        """Keep a login in progress (``state``, ``nonce``, PKCE ``verifier``) on the server; its id in the cookie."""
        self._set_cookie(response, self._insert(LOGIN, pending, email=None, csrf=None, seconds=LOGIN_SECONDS), LOGIN_SECONDS)

    def take_login(self, request: Request) -> dict | None:
        """The login in progress this request's cookie names, removed (a callback is used once); None when
        there is none (not started here, finished already, or older than :data:`LOGIN_SECONDS`)."""
        session_id = self._id(request)
        r = self._row(session_id, LOGIN)
        if r is None or not self._delete(session_id):
            return None
        return json.loads(r.data)

    def start(self, response: Response, *, email: str, iss: str, sub: str, cred: str) -> Session:
        """Log a verified person in: a new session (a new id: nothing of the login's cookie carries over)."""
        now = time.time()
        csrf = secrets.token_urlsafe(32)
        session_id = self._insert(SESSION, {"iss": iss, "sub": sub, "cred": cred, "at": now}, email=email, csrf=csrf,
                                  seconds=self.session_seconds)
        self._set_cookie(response, session_id, self.session_seconds)
        return Session(email=email, iss=iss, sub=sub, cred=cred, at=now, csrf=csrf, until=now + self.session_seconds)

    def end(self, request: Request, response: Response) -> bool:
        """Log out: the session's row is deleted (every copy of the cookie is dead) and the cookie cleared."""
        session_id = self._id(request)
        ended = self._delete(session_id) if session_id else False
        self.clear_cookie(response)
        return ended


__all__ = ["COOKIE", "LOGIN_SECONDS", "ReviewSessions", "SECURE_COOKIE", "SESSION_SECONDS", "Session"]
