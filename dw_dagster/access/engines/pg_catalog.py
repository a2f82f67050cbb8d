"""PostgreSQL's roles, memberships and ACLs, read from its catalog, and the privilege rules applied to them.

The rules are PostgreSQL's own (``src/backend/utils/adt/acl.c``), applied to a copy of the catalog
so a grant can be tried without running it:

- **privileges of a role** (``has_privs_of_role``): the role, and every role it is a member of
  through memberships it *inherits*. Up to PostgreSQL 15 a membership is followed only from a role
  with the ``INHERIT`` attribute; from 16 each membership has its own ``inherit_option``.
- **SET ROLE**: up to 15 any membership chain lets a role ``SET ROLE`` to the other (a
  ``NOINHERIT`` role gets nothing automatically, but can switch); from 16 each link needs its
  ``set_option``.
- **WITH ADMIN**: a role administers X when a role of its membership closure (any chain) is a
  member of X ``WITH ADMIN OPTION``; it can then grant X to anyone, itself included.
- **a relation privilege** (``pg_class_aclmask``): an ACL entry (the owner's default ACL when
  ``relacl`` is NULL) for PUBLIC or for a role the grantee has the privileges of; members of
  ``pg_read_all_data`` read every relation, of ``pg_write_all_data`` write it (14+); a
  superuser holds everything.
- **a column privilege** (``has_column_privilege``): the table-level privilege, or an entry in the
  column's ACL.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from dw_dagster.databases import Database

PUBLIC = 0
READ_ALL, WRITE_ALL = "pg_read_all_data", "pg_write_all_data"
REL_KINDS = ("r", "p", "v", "m", "f")
_USER_RELS = ("c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT n.nspname IN ('pg_catalog', 'information_schema') "
              "AND LEFT(n.nspname, 8) <> 'pg_toast' AND LEFT(n.nspname, 7) <> 'pg_temp'")


def render(template: str, **values: object) -> str:
    """A PostgreSQL template with ``:name`` placeholders filled by sqlglot literals (ints and int
    lists become ``ARRAY[...]``), rendered for PostgreSQL."""
    def lit(v: object) -> exp.Expression:
        if isinstance(v, (list, tuple, set, frozenset)):
            items = sorted(v) if isinstance(v, (set, frozenset)) else list(v)
            return exp.Array(expressions=[lit(x) for x in items] or [exp.Literal.number(-1)])
        if isinstance(v, bool):
            return exp.Boolean(this=v)
        if isinstance(v, int):
            return exp.Literal.number(v)
        return exp.Literal.string(str(v))

    tree = exp.replace_placeholders(sqlglot.parse_one(template, read="postgres"), **{k: lit(v) for k, v in values.items()})
    return tree.sql("postgres")


@dataclass(frozen=True)
class Role:
    oid: int
    name: str
    inherit: bool
    superuser: bool
    login: bool
    valid_until: dt.datetime | None
    createrole: bool


@dataclass(frozen=True)
class Edge:
    """``member`` is a member of ``role`` (one ``pg_auth_members`` row; options from 16 on)."""

    role: int
    member: int
    admin: bool = False
    inherit: bool | None = None
    set: bool | None = None


@dataclass(frozen=True)
class Rel:
    oid: int
    schema: str
    name: str
    kind: str
    owner: int

    @property
    def display(self) -> str:
        """``schema.table`` as PostgreSQL reads it back (parts quoted when they need it)."""
        return table_display(self.schema, self.name)


def table_display(schema: str, name: str) -> str:
    """``schema.table`` as one would type it in PostgreSQL: a part is quoted when it needs it, capitals included."""
    def part(n: str) -> exp.Identifier:
        node = exp.to_identifier(n)
        if n != n.lower():
            node.set("quoted", True)
        return node

    return exp.Table(this=part(name), db=part(schema)).sql("postgres")


def ident(name: str) -> exp.Identifier:
    """A catalog name as an identifier, always quoted: never case-folded (``"Dana"`` stays Dana)."""
    from dw_dagster.databases.sql import identifier

    node = identifier(name)
    node.set("quoted", True)
    return node


@dataclass
class Catalog:
    """Roles and memberships of one PostgreSQL cluster, and the relations of one database."""

    version: int
    roles: dict[int, Role]
    edges: list[Edge]
    rels: dict[int, Rel] = field(default_factory=dict)

    @property
    def per_grant_options(self) -> bool:
        """PostgreSQL 16 and later keep INHERIT and SET per membership."""
        return self.version >= 160000

    @classmethod
    def load(cls, db: Database) -> Catalog:
        version = int(db.fetch_all("SELECT current_setting('server_version_num')")[0][0])
        roles = {int(r[0]): Role(int(r[0]), r[1], bool(r[2]), bool(r[3]), bool(r[4]), _aware(r[5]), bool(r[6])) for r in db.fetch_all(
            "SELECT CAST(oid AS BIGINT), rolname, rolinherit, rolsuper, rolcanlogin, "
            "CASE WHEN rolvaliduntil = 'infinity' THEN NULL ELSE rolvaliduntil END, rolcreaterole "
            "FROM pg_roles")}
        cols = "CAST(roleid AS BIGINT), CAST(member AS BIGINT), admin_option"
        if version >= 160000:
            edges = [Edge(int(r[0]), int(r[1]), bool(r[2]), bool(r[3]), bool(r[4])) for r in db.fetch_all(
                f"SELECT {cols}, inherit_option, set_option FROM pg_auth_members")]
        else:
            edges = [Edge(int(r[0]), int(r[1]), bool(r[2])) for r in db.fetch_all(f"SELECT {cols} FROM pg_auth_members")]
        rels = {int(r[0]): Rel(int(r[0]), r[1], r[2], r[3], int(r[4])) for r in db.fetch_all(
            "SELECT CAST(c.oid AS BIGINT), n.nspname, c.relname, c.relkind, CAST(c.relowner AS BIGINT) FROM pg_class AS c "
            f"JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE {_USER_RELS}")}
        return cls(version, roles, edges, rels)

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles.values() if r.name == name), None)

    def role_named(self, name: str) -> int | None:
        r = self.role(name)
        return r.oid if r else None

    def similar_roles(self, name: str) -> list[str]:
        low = name.casefold()
        return sorted(r.name for r in self.roles.values() if r.name.casefold() == low and r.name != name)

    # -- closures ----------------------------------------------------------------------------------

    def _walk(self, start: int, edges: Iterable[Edge], follow) -> frozenset[int]:
        out_edges: dict[int, list[Edge]] = defaultdict(list)
        for e in edges:
            out_edges[e.member].append(e)
        seen, queue = {start}, [start]
        while queue:
            x = queue.pop()
            for e in out_edges.get(x, ()):
                if e.role not in seen and follow(x, e):
                    seen.add(e.role)
                    queue.append(e.role)
        return frozenset(seen)

    def privs_of(self, start: int, edges: Iterable[Edge]) -> frozenset[int]:
        """The roles whose privileges ``start`` has (itself included): ``roles_is_member_of(ROLERECURSE_PRIVS)``."""
        if self.per_grant_options:
            return self._walk(start, edges, lambda x, e: bool(e.inherit))
        return self._walk(start, edges, lambda x, e: self.roles[x].inherit if x in self.roles else False)

    def members_of(self, start: int, edges: Iterable[Edge]) -> frozenset[int]:
        """Every role ``start`` is a member of through any chain (``ROLERECURSE_MEMBERS``)."""
        return self._walk(start, edges, lambda x, e: True)

    def settable(self, start: int, edges: Iterable[Edge]) -> frozenset[int]:
        """The roles ``start`` may ``SET ROLE`` to (15: any chain; 16+: links with ``set_option``)."""
        if self.per_grant_options:
            return self._walk(start, edges, lambda x, e: bool(e.set))
        return self.members_of(start, edges)

    def administered(self, start: int, edges: Iterable[Edge]) -> frozenset[int]:
        """The roles ``start`` can grant to anyone (itself included): ``is_admin_of_role``."""
        edges = list(edges)
        closure = self.members_of(start, edges)
        return frozenset(e.role for e in edges if e.admin and e.member in closure and e.role != start)

    def reach_roles(self, start: int, edges: Iterable[Edge]) -> dict[int, tuple[str, int]]:
        """Every role whose privileges ``start`` can use in some way, with how: ``(privilege|set_role|admin, via)``."""
        edges = list(edges)
        out: dict[int, tuple[str, int]] = {r: ("privilege", r) for r in self.privs_of(start, edges)}
        for s in sorted(self.settable(start, edges)):
            for r in self.privs_of(s, edges):
                out.setdefault(r, ("set_role", s))
        for x in sorted(self.administered(start, edges)):
            for r in self.privs_of(x, [*edges, Edge(role=x, member=start, inherit=True, set=True)]):
                out.setdefault(r, ("admin", x))
        return out

    def name(self, oid: int) -> str:
        return "PUBLIC" if oid == PUBLIC else self.roles[oid].name if oid in self.roles else f"oid {oid}"


def _aware(v) -> dt.datetime | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v)
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.timezone.utc)
    return v


@dataclass
class Acls:
    """The exploded ACL entries of relations and columns for a set of grantees (PUBLIC always among them)."""

    table: dict[int, list[tuple[int, str, bool]]] = field(default_factory=lambda: defaultdict(list))   # grantee -> (rel, priv, grantable)
    column: dict[int, list[tuple[int, str, str, bool]]] = field(default_factory=lambda: defaultdict(list))  # grantee -> (rel, att, priv, g)
    default: list[tuple[int, str | None, int, str]] = field(default_factory=list)  # (creator, schema, grantee, priv)
    schema_usage: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))  # grantee -> schemas
    queries: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, db: Database, grantees: Iterable[int]) -> Acls:
        who = sorted({PUBLIC, *grantees})
        acls = cls()
        q_tables = render(
            "SELECT CAST(c.oid AS BIGINT), CAST(a.grantee AS BIGINT), a.privilege_type, a.is_grantable FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL aclexplode(COALESCE(c.relacl, acldefault('r', c.relowner))) AS a "
            f"WHERE {_USER_RELS} AND a.grantee = ANY(:who)", who=who)
        for rel, g, priv, grantable in db.fetch_all(q_tables):
            acls.table[int(g)].append((int(rel), priv, bool(grantable)))
        q_columns = render(
            "SELECT CAST(at.attrelid AS BIGINT), at.attname, CAST(a.grantee AS BIGINT), a.privilege_type, a.is_grantable "
            "FROM pg_attribute AS at JOIN pg_class AS c ON c.oid = at.attrelid JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL aclexplode(at.attacl) AS a "
            f"WHERE at.attnum > 0 AND NOT at.attisdropped AND NOT at.attacl IS NULL AND {_USER_RELS} AND a.grantee = ANY(:who)",
            who=who)
        for rel, att, g, priv, grantable in db.fetch_all(q_columns):
            acls.column[int(g)].append((int(rel), att, priv, bool(grantable)))
        q_default = render(
            "SELECT CAST(d.defaclrole AS BIGINT), n.nspname, CAST(a.grantee AS BIGINT), a.privilege_type FROM pg_default_acl AS d "
            "LEFT JOIN pg_namespace AS n ON n.oid = d.defaclnamespace CROSS JOIN LATERAL aclexplode(d.defaclacl) AS a "
            "WHERE d.defaclobjtype = 'r' AND a.grantee = ANY(:who)", who=who)
        acls.default = [(int(r[0]), r[1], int(r[2]), r[3]) for r in db.fetch_all(q_default)]
        q_usage = render(
            "SELECT n.nspname, CAST(a.grantee AS BIGINT) FROM pg_namespace AS n "
            "CROSS JOIN LATERAL aclexplode(COALESCE(n.nspacl, acldefault('n', n.nspowner))) AS a "
            "WHERE a.privilege_type = 'USAGE' AND a.grantee = ANY(:who)", who=who)
        for schema, g in db.fetch_all(q_usage):
            acls.schema_usage[int(g)].add(schema)
        acls.queries = [q_tables, q_columns, q_default, q_usage]
        return acls


@dataclass
class Held:
    """What a set of roles holds: table privileges and column privileges, each with its grant option."""

    table: dict[tuple[int, str], bool]
    column: dict[tuple[int, str, str], bool]
    schemas: set[str]
    superuser: bool = False

    def has_table(self, rel: int, priv: str) -> bool:
        return self.superuser or (rel, priv) in self.table

    def has_column(self, rel: int, att: str, priv: str) -> bool:
        return self.has_table(rel, priv) or (rel, att, priv) in self.column


def held_by(cat: Catalog, acls: Acls, roles: frozenset[int], *, extra_table: Iterable[tuple[int, str]] = (),
            extra_column: Iterable[tuple[int, str, str]] = (), drop_table: Iterable[tuple[int, str]] = (),
            drop_column: Iterable[tuple[int, str, str]] = (), grantee: int | None = None) -> Held:
    """The privileges ``roles`` (a closure, the grantee in it) hold, with ACL entries for ``grantee``
    added (``extra_*``, a grant tried) or taken away (``drop_*``, an earlier grant's revoke tried)."""
    if grantee is not None and grantee in cat.roles and cat.roles[grantee].superuser:
        return Held({}, {}, set(), superuser=True)
    dropped_t, dropped_c = set(drop_table), set(drop_column)
    table: dict[tuple[int, str], bool] = {}
    column: dict[tuple[int, str, str], bool] = {}
    for g in {PUBLIC, *roles}:
        for rel, priv, grantable in acls.table.get(g, ()):
            if g == grantee and (rel, priv) in dropped_t:
                continue
            table[(rel, priv)] = table.get((rel, priv), False) or grantable
        for rel, att, priv, grantable in acls.column.get(g, ()):
            if g == grantee and (rel, att, priv) in dropped_c:
                continue
            column[(rel, att, priv)] = column.get((rel, att, priv), False) or grantable
    for key in extra_table:
        table.setdefault(key, False)
    for key in extra_column:
        column.setdefault(key, False)
    names = {cat.roles[r].name for r in roles if r in cat.roles}
    schemas = set().union(*(acls.schema_usage.get(g, set()) for g in {PUBLIC, *roles}))
    if READ_ALL in names:
        for rel in cat.rels:
            table.setdefault((rel, "SELECT"), False)
        schemas |= {r.schema for r in cat.rels.values()}
    if WRITE_ALL in names:
        for rel in cat.rels:
            for p in ("INSERT", "UPDATE", "DELETE"):
                table.setdefault((rel, p), False)
        schemas |= {r.schema for r in cat.rels.values()}
    return Held(table, column, schemas)


__all__ = ["Acls", "Catalog", "Edge", "Held", "PUBLIC", "Rel", "Role", "held_by", "ident", "render", "table_display"]
