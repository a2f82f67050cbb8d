"""Snowflake's grants for the access tests: ``SHOW GRANTS`` answered as Snowflake documents it, the
GRANT / REVOKE / CREATE ROLE / DROP ROLE statements applied to that model, everything else
(``INFORMATION_SCHEMA.COLUMNS``) run on fakesnow.

fakesnow 0.12 refuses every statement about roles and grants (its parser rejects ``CREATE ROLE``,
``GRANT``, ``SHOW GRANTS``), so this double stands in for them. Its rows follow the Snowflake
documentation of ``SHOW GRANTS`` (https://docs.snowflake.com/en/sql-reference/sql/show-grants):
``TO ROLE``: ``created_on, privilege, granted_on, name, granted_to, grantee_name, grant_option,
granted_by``; ``TO USER``: ``created_on, role, granted_to, grantee_name, granted_by``; ``FUTURE
GRANTS TO ROLE``: ``created_on, privilege, grant_on, name, grant_to, grantee_name, grant_option``.
A role or user that does not exist is refused with Snowflake's message ("does not exist or not
authorized"). Every statement executed is kept in ``executed`` (and parsed by sqlglot first).
"""

from __future__ import annotations

import datetime as dt
import re

import sqlglot
from sqlglot import exp

from dw_dagster.databases import DatabaseError

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
_NAME = r'"((?:[^"]|"")+)"'


class SnowflakeGrants:
    """The account's roles, users and grants (names as Snowflake stores them)."""

    def __init__(self, columns_db, database: str = "DB") -> None:
        self.columns_db = columns_db
        self.dialect = "snowflake"
        self.name = f"snowflake:acct/{database}/S"
        self.database = database
        self.roles: set[str] = {"PUBLIC", "SYSADMIN"}
        self.users: dict[str, set[str]] = {}
        self.role_roles: dict[str, set[str]] = {"PUBLIC": set(), "SYSADMIN": set()}
        self.privs: dict[str, set[tuple[str, str, str, bool]]] = {"PUBLIC": set(), "SYSADMIN": set()}
        self.future: dict[str, set[tuple[str, str, str]]] = {}
        self.executed: list[str] = []
        self.aborted: list[str] = []

    # -- set-up ------------------------------------------------------------------------------------
    def role(self, name: str) -> str:
        self.roles.add(name)
        self.role_roles.setdefault(name, set())
        self.privs.setdefault(name, set())
        return name

    def user(self, name: str, *roles: str) -> str:
        self.users[name] = set(roles)
        return name

    def grant_priv(self, role: str, priv: str, table: str, kind: str = "TABLE", grant_option: bool = False) -> None:
        self.privs[role].add((priv, kind, table, grant_option))

    # -- the Database protocol ---------------------------------------------------------------------
    def fetch_all(self, sql: str) -> list[tuple]:
        m = re.fullmatch(rf"SHOW GRANTS TO USER {_NAME}", sql)
        if m:
            user = m.group(1).replace('""', '"')
            if user not in self.users:
                raise DatabaseError(f"snowflake: query failed: User '{user}' does not exist or not authorized.")
            return [(NOW, r, "USER", user, "SECURITYADMIN") for r in sorted(self.users[user])]
        m = re.fullmatch(rf"SHOW GRANTS TO ROLE {_NAME}", sql)
        if m:
            role = m.group(1).replace('""', '"')
            if role not in self.roles:
                raise DatabaseError(f"snowflake: query failed: Role '{role}' does not exist or not authorized.")
            rows = [(NOW, "USAGE", "ROLE", r, "ROLE", role, "false", "SECURITYADMIN") for r in sorted(self.role_roles[role])]
            rows += [(NOW, p, k, t, "ROLE", role, str(g).lower(), "SYSADMIN") for p, k, t, g in sorted(self.privs[role])]
            return rows
        m = re.fullmatch(rf"SHOW FUTURE GRANTS TO ROLE {_NAME}", sql)
        if m:
            role = m.group(1).replace('""', '"')
            return [(NOW, p, k, n, "ROLE", role, "false") for p, k, n in sorted(self.future.get(role, set()))]
        return self.columns_db.fetch_all(sql)

    def execute(self, sql: str) -> None:
        sqlglot.parse_one(sql, read="snowflake")  # every statement must at least parse as Snowflake SQL
        self.executed.append(sql)
        if m := re.fullmatch(rf"CREATE ROLE IF NOT EXISTS {_NAME}", sql):
            self.role(m.group(1))
        elif m := re.fullmatch(rf"DROP ROLE IF EXISTS {_NAME}", sql):
            r = m.group(1)
            self.roles.discard(r)
            self.privs.pop(r, None)
            self.role_roles.pop(r, None)
            for rs in [*self.users.values(), *self.role_roles.values()]:
                rs.discard(r)
        elif m := re.fullmatch(rf"GRANT ROLE {_NAME} TO USER {_NAME}", sql):
            self._need(m.group(1), m.group(2))
            self.users[m.group(2)].add(m.group(1))
        elif m := re.fullmatch(rf"REVOKE ROLE {_NAME} FROM USER {_NAME}", sql):
            self._need(m.group(1), m.group(2))
            self.users[m.group(2)].discard(m.group(1))
        elif m := re.fullmatch(rf"GRANT USAGE ON (DATABASE|SCHEMA) (.+) TO ROLE {_NAME}", sql):
            self.privs[m.group(3)].add(("USAGE", m.group(1), m.group(2).replace('"', ""), False))
        elif m := re.fullmatch(rf"ALTER USER {_NAME} ABORT ALL QUERIES", sql):
            self.aborted.append(m.group(1))
        else:
            tree = sqlglot.parse_one(sql, read="snowflake")
            if not isinstance(tree, (exp.Grant, exp.Revoke)):
                raise DatabaseError(f"snowflake double: statement not modelled: {sql}")
            table = ".".join(p.name for p in (tree.args["securable"].args.get("catalog"), tree.args["securable"].args.get("db"),
                                              tree.args["securable"].this) if p is not None)
            role = tree.args["principals"][0].this.name
            for pr in tree.args["privileges"]:
                key = (pr.this.name.upper(), "TABLE", table, False)
                (self.privs[role].add if isinstance(tree, exp.Grant) else self.privs[role].discard)(key)

    def _need(self, role: str, user: str) -> None:
        if role not in self.roles:
            raise DatabaseError(f"snowflake: statement failed: Role '{role}' does not exist or not authorized.")
        if user not in self.users:
            raise DatabaseError(f"snowflake: statement failed: User '{user}' does not exist or not authorized.")
