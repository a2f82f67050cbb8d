"""Snowflake: the dry-run of a grant from ``SHOW GRANTS`` and role inheritance, the grant, a verified revoke.

Snowflake grants privileges to roles only, and a user gets the privileges of every role granted
to it and of the roles those roles were granted, down the hierarchy (Snowflake docs, "Overview of
Access Control", role hierarchy and privilege inheritance), plus ``PUBLIC``. With secondary roles
(``DEFAULT_SECONDARY_ROLES = ('ALL')``, the default for new users) a session uses all of them at
once, so the dry-run counts the union. It reads:

- ``SHOW GRANTS TO USER <u>``: the roles granted to the user (columns ``created_on, role,
  granted_to, grantee_name, granted_by``);
- ``SHOW GRANTS TO ROLE <r>``: the privileges of a role and the roles granted to it (``USAGE`` on
  ``ROLE``); columns ``created_on, privilege, granted_on, name, granted_to, grantee_name,
  grant_option, granted_by``; ``OWNERSHIP`` holds every privilege;
- ``SHOW FUTURE GRANTS TO ROLE <r>``: future grants (tables created later); columns
  ``created_on, privilege, grant_on, name, grant_to, grantee_name, grant_option``;
- ``INFORMATION_SCHEMA.COLUMNS`` of the database: the columns of every reachable table.

Snowflake has no column privileges (masking policies and secure views play that part), so a
request naming columns is refused. A table request is granted through a role of its own
(``DW_ACCESS_<request>``): created, given ``USAGE`` on the database and schema and the privilege
on each table, and granted to the user; its rollback revokes that role from the user and drops
it. A role request is ``GRANT ROLE … TO USER …``. Names are quoted exactly as Snowflake stores
them (unquoted names fold to upper case). At the revoke, ``end_sessions`` aborts the user's running
queries (``ALTER USER … ABORT ALL QUERIES``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from dw_dagster.access.models import TABLE_PRIVILEGES, AccessError, AccessSpec, EngineDryRun, FutureGrant, Reachable
from dw_dagster.databases import Database, DatabaseError

TABLE_KINDS = ("TABLE", "VIEW", "MATERIALIZED_VIEW", "EXTERNAL_TABLE", "DYNAMIC_TABLE", "ICEBERG_TABLE")
PUBLIC = "PUBLIC"


def ident(name: str) -> exp.Identifier:
    from dw_dagster.databases.sql import identifier

    node = identifier(name)
    node.set("quoted", True)
    return node


def q(name: str) -> str:
    return ident(name).sql("snowflake")


def parse_name(text: str) -> str:
    """A name as Snowflake stores it: unquoted upper-cased, ``"quoted"`` exactly."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == '"':
        return t[1:-1].replace('""', '"')
    if not t or any(ch.isspace() or ch in '".;' for ch in t):
        raise AccessError(f"{text!r} is not a name: quote it if it holds spaces or dots")
    return t.upper()


def parse_table(text: str, database: str | None) -> tuple[str, str, str]:
    try:
        table = exp.to_table(text.strip(), dialect="snowflake")
    except sqlglot.errors.ParseError as e:
        raise AccessError(f"{text!r} is not a table name: {e}") from None
    parts = [p for p in (table.args.get("catalog"), table.args.get("db"), table.this) if p is not None]
    fold = [p.name if p.quoted else p.name.upper() for p in parts]
    if len(fold) == 2 and database:
        fold = [database, *fold]
    if len(fold) != 3:
        raise AccessError(f"name table {text!r} as database.schema.table (or schema.table with a database set)")
    return fold[0], fold[1], fold[2]


def display(db_name: str, schema: str, table: str) -> str:
    def part(n: str) -> exp.Identifier:
        node = exp.to_identifier(n)
        if n != n.upper():
            node.set("quoted", True)
        return node

    return exp.Table(this=part(table), db=part(schema), catalog=part(db_name)).sql("snowflake")


class Grants:
    """What ``SHOW GRANTS`` says, read once per role (a dry-run reads each role of the hierarchy once)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._roles: dict[str, list[tuple]] = {}
        self.queries: list[str] = []

    def _show(self, sql: str, what: str) -> list[tuple]:
        self.queries.append(sql)
        try:
            return self.db.fetch_all(sql)
        except DatabaseError as e:
            if "does not exist" in str(e).lower() or "not authorized" in str(e).lower():
                raise AccessError(f"{what} does not exist (or is not visible to this connection's role)") from None
            raise

    def user_roles(self, user: str) -> set[str]:
        rows = self._show(f"SHOW GRANTS TO USER {q(user)}", f"user {user}")
        return {str(r[1]) for r in rows}

    def role_rows(self, role: str) -> list[tuple]:
        if role not in self._roles:
            self._roles[role] = self._show(f"SHOW GRANTS TO ROLE {q(role)}", f"role {role}")
        return self._roles[role]

    def closure(self, roles: set[str]) -> set[str]:
        seen, todo = set(), [*roles, PUBLIC]
        while todo:
            r = todo.pop()
            if r in seen:
                continue
            seen.add(r)
            todo += [str(row[3]) for row in self.role_rows(r) if str(row[2]).upper() == "ROLE" and str(row[1]).upper() == "USAGE"]
        return seen

    def privileges(self, roles: set[str]) -> dict[tuple[str, str], bool]:
        """``(table name as shown, privilege) -> grant option`` over ``roles``."""
        out: dict[tuple[str, str], bool] = {}
        for r in roles:
            for row in self.role_rows(r):
                if str(row[2]).upper() not in TABLE_KINDS:
                    continue
                privs = TABLE_PRIVILEGES if str(row[1]).upper() == "OWNERSHIP" else (str(row[1]).upper(),)
                name = display(*_split(str(row[3])))
                for p in privs:
                    key = (name, p)
                    out[key] = out.get(key, False) or str(row[6]).lower() == "true" or str(row[1]).upper() == "OWNERSHIP"
        return out

    def future(self, role: str) -> list[tuple]:
        sql = f"SHOW FUTURE GRANTS TO ROLE {q(role)}"
        self.queries.append(sql)
        return self.db.fetch_all(sql)


def _split(shown: str) -> tuple[str, str, str]:
    """``DB.SCHEMA.TABLE`` as SHOW GRANTS prints it (quoted parts keep their quotes) into its parts."""
    t = exp.to_table(shown, dialect="snowflake")
    parts = [p for p in (t.args.get("catalog"), t.args.get("db"), t.this) if p is not None]
    names = [p.name for p in parts]
    while len(names) < 3:
        names.insert(0, "")
    return names[0], names[1], names[2]


def columns_of(db: Database, tables: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], list[tuple[str, str]]]:
    out: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for d, s, t in tables:
        sql = (f"SELECT column_name, COALESCE(comment, '') FROM {q(d)}.information_schema.columns "
               f"WHERE table_schema = {exp.Literal.string(s).sql('snowflake')} "
               f"AND table_name = {exp.Literal.string(t).sql('snowflake')} ORDER BY ordinal_position")
        out[(d, s, t)] = [(str(r[0]), str(r[1] or "")) for r in db.fetch_all(sql)]
    return out


def access_role(request_id: str) -> str:
    """The role a table request is granted through: ``DW_ACCESS_<request id>`` (``-`` → ``_``, upper case)."""
    return "DW_ACCESS_" + "".join(ch if ch.isalnum() else "_" for ch in request_id.upper())


def dry_run(db: Database, spec: AccessSpec, grantee: str, *, expires_at: dt.datetime, request_id: str,
            database: str | None = None, taking_over: Sequence[EngineDryRun] = ()) -> EngineDryRun:
    """What granting ``spec`` to user ``grantee`` opens (module docstring); nothing is run.

    Raises:
        AccessError: no such user, role or table; columns asked for (Snowflake has no column privileges).
    """
    if bool(spec.role) == bool(spec.tables):
        raise AccessError("ask for a role (--grant) or for tables (--tables), not both and not neither")
    if spec.columns:
        raise AccessError("Snowflake grants privileges on whole tables only: ask for the table, or for a secure view or "
                          "a masking policy that hides the other columns")
    grants = Grants(db)
    user = grantee
    prior = {r for t in taking_over for r in t.state.get("granted_roles", [])}
    direct = grants.user_roles(user) - prior
    statements, rollback, held, notes, tables = [], [], [], [], []
    granted: list[str] = []
    extra: dict[tuple[str, str], bool] = {}
    if spec.role:
        role = parse_name(spec.role)
        grants.role_rows(role)  # refused when it does not exist
        if role in direct:
            held.append(f"role {role}")
        else:
            granted.append(role)
            statements.append(f"GRANT ROLE {q(role)} TO USER {q(user)}")
            rollback.append(f"REVOKE ROLE {q(role)} FROM USER {q(user)}")
    else:
        priv = spec.privilege.strip().upper()
        if priv not in TABLE_PRIVILEGES:
            raise AccessError(f"privilege {spec.privilege!r} is not one of {', '.join(TABLE_PRIVILEGES)}")
        temp = access_role(request_id)
        before_privs = grants.privileges(grants.closure(direct))
        wanted = []
        for text in spec.tables:
            d, s, t = parse_table(text, database)
            name = display(d, s, t)
            if not columns_of(db, [(d, s, t)])[(d, s, t)]:
                raise AccessError(f"no table {text!r} (read as {name}; unquoted names fold to upper case)")
            tables.append(name)
            if (name, priv) in before_privs:
                held.append(f"{priv} on {name}")
                continue
            wanted.append((d, s, t))
            extra[(name, priv)] = False
        if wanted:
            granted.append(temp)
            statements.append(f"CREATE ROLE IF NOT EXISTS {q(temp)}")
            for d in sorted({w[0] for w in wanted}):
                statements.append(f"GRANT USAGE ON DATABASE {q(d)} TO ROLE {q(temp)}")
            for d, s in sorted({(w[0], w[1]) for w in wanted}):
                statements.append(f"GRANT USAGE ON SCHEMA {q(d)}.{q(s)} TO ROLE {q(temp)}")
            for d, s, t in wanted:
                statements.append(exp.Grant(privileges=[exp.GrantPrivilege(this=exp.Var(this=priv))], kind="TABLE",
                                            securable=exp.Table(this=ident(t), db=ident(s), catalog=ident(d)),
                                            principals=[exp.GrantPrincipal(this=ident(temp), kind="ROLE")]).sql("snowflake"))
            statements.append(f"GRANT ROLE {q(temp)} TO USER {q(user)}")
            rollback += [f"REVOKE ROLE {q(temp)} FROM USER {q(user)}", f"DROP ROLE IF EXISTS {q(temp)}"]
    before_roles = grants.closure(direct)
    after_roles = grants.closure(direct | {r for r in granted if not r.startswith("DW_ACCESS_")})
    before = grants.privileges(before_roles)
    after = {**grants.privileges(after_roles), **extra}
    new_keys = sorted(k for k in after if k not in before)
    cols = columns_of(db, sorted({_split(k[0]) for k in new_keys}))
    newly = [Reachable(table=name, columns=[c for c, _ in cols.get(_split(name), [])], privilege=p, table_level=True,
                       grant_option=after[(name, p)]) for name, p in new_keys]
    future = []
    for r in sorted(after_roles - before_roles):
        for row in grants.future(r):
            if str(row[2]).upper() in TABLE_KINDS:
                d, s, _ = _split(str(row[3]).replace("<TABLE>", "X").replace("<VIEW>", "X"))
                future.append(FutureGrant(schema_name=f"{d}.{s}", creator=None, privilege=str(row[1]).upper(), via=r))
    if any(x.grant_option for x in newly):
        notes.append("the grant carries WITH GRANT OPTION on some tables: the user could pass those privileges on")
    opens = bool(newly or future)
    return EngineDryRun(
        engine="snowflake", grantee_role=user, role=parse_name(spec.role) if spec.role else None,
        tables=tables, statements=statements if opens else [], rollback=rollback if opens else [], already_held=held,
        newly_reachable=newly, future_tables=future,
        columns={display(*k): v for k, v in cols.items()}, notes=notes,
        state={"user": user, "granted_roles": granted, "temp_role": granted[0] if spec.tables and granted else None},
        queries=grants.queries)


def apply_grant(db: Database, run: EngineDryRun, statements: Sequence[str]) -> dict[str, Any]:
    """Run the approved statements one by one (Snowflake commits DDL at once), then check with
    ``SHOW GRANTS TO USER`` that the user holds the granted role.

    Raises:
        AccessError: the user does not show the role afterwards.
        DatabaseError: a statement failed (the revoke path then removes what was granted).
    """
    for s in statements:
        db.execute(s)
    roles = Grants(db).user_roles(run.state["user"])
    missing = [r for r in run.state.get("granted_roles", []) if r not in roles]
    if missing:
        raise AccessError(f"SHOW GRANTS TO USER {run.state['user']} does not list {', '.join(missing)} after the grant")
    return {"checks": [{"check": f"SHOW GRANTS TO USER {run.state['user']} lists {r}", "value": True, "expected": True}
                       for r in run.state.get("granted_roles", [])]}


def apply_revoke(db: Database, run: EngineDryRun, *, end_sessions: bool) -> dict[str, Any]:
    """Run the rollback (a role already gone is fine), abort the user's queries when asked, verify."""
    done, notes = [], []
    for s in run.rollback:
        try:
            db.execute(s)
            done.append(s)
        except DatabaseError as e:
            if "does not exist" in str(e).lower():
                notes.append(f"{s}: already gone ({str(e).splitlines()[0][:200]})")
                continue
            raise
    ended = 0
    if end_sessions:
        db.execute(f"ALTER USER {q(run.state['user'])} ABORT ALL QUERIES")
        ended = 1
    return {**verify_revoked(db, run), "statements": done, "sessions_ended": ended, "notes": notes}


def verify_revoked(db: Database, run: EngineDryRun) -> dict[str, Any]:
    """``SHOW GRANTS TO USER``: none of the granted roles; and none of ``newly_reachable`` in the
    privileges of the user's roles now."""
    g = Grants(db)
    user = run.state["user"]
    try:
        roles = g.user_roles(user)
    except AccessError:
        return {"verified": True, "checks": [{"check": f"user {user} exists", "value": False, "expected": False}]}
    checks = [{"check": f"SHOW GRANTS TO USER {user} lists {r}", "value": r in roles, "expected": False}
              for r in run.state.get("granted_roles", [])]
    privs = g.privileges(g.closure(roles))
    for x in run.newly_reachable:
        checks.append({"check": f"{x.privilege} on {x.table} through the roles of {user}",
                       "value": (x.table, x.privilege) in privs, "expected": False})
    return {"verified": not any(c["value"] for c in checks), "checks": checks}


__all__ = ["Grants", "access_role", "apply_grant", "apply_revoke", "dry_run", "parse_name", "parse_table", "verify_revoked"]
