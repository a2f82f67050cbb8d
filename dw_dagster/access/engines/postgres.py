"""PostgreSQL: the dry-run of a grant from the catalog, the grant, and a revoke verified on the server.

The dry-run never runs the grant. It reads the roles, memberships and ACLs
(:mod:`.pg_catalog`), adds the grant to a copy and applies PostgreSQL's rules to both:
``newly_reachable`` is, per table and privilege, what ``has_table_privilege`` /
``has_column_privilege`` answer after the grant and did not before. The tests prove that equality
on a real server by running the grant inside a transaction they roll back.

It also names what the grant opens in other ways: roles the grantee can ``SET ROLE`` to (a
``NOINHERIT`` grantee gets nothing automatically but can switch), roles it can grant itself
(``WITH ADMIN OPTION`` somewhere in the granted role's memberships), and default privileges
(``ALTER DEFAULT PRIVILEGES``) that will open tables created later. A grant that would let the
grantee become a superuser is refused.

The statements are built with sqlglot, every name quoted exactly as the catalog spells it (never
case-folded). A privilege the grantee holds already by a grant of its own is not granted again,
so the rollback never revokes it; a table-level ``REVOKE`` also takes away the column privileges
of that table (PostgreSQL's REVOKE documentation), so the rollback grants back the column
privileges the grantee held before. A login role also gets ``VALID UNTIL`` the grant's end (a
second line should the revoke not happen; it stops password logins only), put back at the revoke.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from dw_dagster.access.engines.pg_catalog import PUBLIC, Acls, Catalog, Edge, Held, held_by, ident, render
from dw_dagster.access.models import COLUMN_PRIVILEGES, TABLE_PRIVILEGES, AccessError, AccessSpec, EngineDryRun, FutureGrant, Reachable
from dw_dagster.databases import Database, DatabaseError


def _q(name: str) -> str:
    return ident(name).sql("postgres")


def parse_name(text: str) -> str:
    """One name as PostgreSQL reads it: unquoted folds to lower case, ``"Quoted"`` keeps its case."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == '"':
        return t[1:-1].replace('""', '"')
    if not t or any(ch.isspace() or ch in '".;' for ch in t):
        raise AccessError(f"{text!r} is not a name: quote it (\"Name\") if it holds spaces, dots or capitals")
    return t.lower()


def parse_table(text: str) -> tuple[str, str]:
    """``schema.table`` as PostgreSQL reads it (a leading database part must be the current one)."""
    try:
        table = exp.to_table(text.strip(), dialect="postgres")
    except sqlglot.errors.ParseError as e:
        raise AccessError(f"{text!r} is not a table name: {e}") from None
    parts = [p for p in (table.args.get("catalog"), table.args.get("db"), table.this) if p is not None]
    if len(parts) < 2:
        raise AccessError(f"name the schema of table {text!r} (schema.table)")
    fold = [p.name if p.quoted else p.name.lower() for p in parts]
    return fold[-2], fold[-1]


def _grant_table(priv: str, schema: str, name: str, grantee: str, columns: Sequence[str] = (), revoke: bool = False) -> str:
    cls = exp.Revoke if revoke else exp.Grant
    return cls(privileges=[exp.GrantPrivilege(this=exp.Var(this=priv), expressions=[exp.Column(this=ident(c)) for c in columns])],
               kind="TABLE", securable=exp.Table(this=ident(name), db=ident(schema)),
               principals=[exp.GrantPrincipal(this=ident(grantee))]).sql("postgres")


def grant_role_sql(role: str, member: str) -> str:
    return f"GRANT {_q(role)} TO {_q(member)}"


def revoke_role_sql(role: str, member: str) -> str:
    return f"REVOKE {_q(role)} FROM {_q(member)}"


def valid_until_sql(role: str, until: dt.datetime | None) -> str:
    value = "infinity" if until is None else until.astimezone(dt.timezone.utc).isoformat()
    return f"ALTER ROLE {_q(role)} VALID UNTIL {exp.Literal.string(value).sql('postgres')}"


def columns_of(db: Database, rels: Iterable[int]) -> dict[int, list[tuple[str, str]]]:
    """``rel -> [(column, comment)]`` in table order (dropped columns left out)."""
    oids = sorted(set(rels))
    out: dict[int, list[tuple[str, str]]] = {r: [] for r in oids}
    if not oids:
        return out
    q = render("SELECT CAST(attrelid AS BIGINT), attname, COALESCE(col_description(attrelid, attnum), '') FROM pg_attribute "
               "WHERE attrelid = ANY(:oids) AND attnum > 0 AND NOT attisdropped ORDER BY attrelid, attnum", oids=oids)
    for rel, att, comment in db.fetch_all(q):
        out[int(rel)].append((att, comment))
    return out


def _diff(cat: Catalog, before: Held, after: Held, cols: dict[int, list[tuple[str, str]]]) -> list[Reachable]:
    """Per relation and privilege: columns ``has_column_privilege`` newly says yes to, and whether
    ``has_table_privilege`` newly does."""
    rels = {r for (r, p) in after.table if not before.has_table(r, p)}
    rels |= {r for (r, a, p) in after.column if not before.has_column(r, a, p)}
    out = []
    for rel in sorted(rels, key=lambda r: cat.rels[r].display if r in cat.rels else str(r)):
        if rel not in cat.rels:
            continue
        names = [c for c, _ in cols.get(rel, [])]
        for p in TABLE_PRIVILEGES:
            t_new = after.has_table(rel, p) and not before.has_table(rel, p)
            new_cols = ([a for a in names if after.has_column(rel, a, p) and not before.has_column(rel, a, p)]
                        if p in COLUMN_PRIVILEGES else [])
            if t_new or new_cols:
                grantable = bool(after.table.get((rel, p))) or any(after.column.get((rel, a, p)) for a in new_cols)
                out.append(Reachable(table=cat.rels[rel].display, columns=new_cols, privilege=p, table_level=t_new,
                                     grant_option=grantable))
    return out


class _Plan:
    """What the request asks the catalog to change: new memberships and new ACL entries of the grantee."""

    def __init__(self) -> None:
        self.edges: list[Edge] = []
        self.table: list[tuple[int, str]] = []
        self.column: list[tuple[int, str, str]] = []
        self.statements: list[str] = []
        self.rollback: list[str] = []
        self.restore: list[str] = []
        self.held: list[str] = []
        self.notes: list[str] = []
        self.role_oid: int | None = None
        self.tables: list[str] = []


def _resolve_rel(cat: Catalog, text: str) -> int:
    schema, name = parse_table(text)
    found = [r for r in cat.rels.values() if r.schema == schema and r.name == name]
    if found:
        return found[0].oid
    near = sorted(r.display for r in cat.rels.values()
                  if r.schema.casefold() == schema.casefold() and r.name.casefold() == name.casefold())
    hint = f"; did you mean {', '.join(near)}? (unquoted names fold to lower case)" if near else ""
    raise AccessError(f"no table {text!r} in this database{hint}")


def _plan_role(cat: Catalog, spec: AccessSpec, g: int, base: list[Edge], plan: _Plan) -> None:
    name = parse_name(spec.role or "")
    role = cat.role(name)
    if role is None:
        near = cat.similar_roles(name)
        raise AccessError(f"no role {name!r} on this server" + (f"; did you mean {', '.join(near)}? (unquoted names fold "
                                                                "to lower case)" if near else ""))
    if role.oid == g:
        raise AccessError(f"{name!r} is the grantee's own role")
    if role.superuser:
        raise AccessError(f"role {name!r} is a superuser: granting it is not an access request")
    plan.role_oid = role.oid
    if any(e.role == role.oid and e.member == g for e in base):
        plan.held.append(f"member of role {role.name}")
        return
    plan.edges.append(Edge(role=role.oid, member=g, inherit=cat.roles[g].inherit, set=True))
    grantee = cat.roles[g].name
    plan.statements.append(grant_role_sql(role.name, grantee))
    plan.rollback.append(revoke_role_sql(role.name, grantee))
    if not cat.roles[g].inherit:
        plan.notes.append(f"{grantee} is NOINHERIT: it gets none of {role.name}'s privileges automatically "
                          f"(has_table_privilege says no), but can SET ROLE {role.name} and use them (also_reachable)")


def _plan_tables(cat: Catalog, spec: AccessSpec, g: int, direct: Held, cols: dict[int, list[tuple[str, str]]],
                 plan: _Plan) -> None:
    priv = spec.privilege.strip().upper()
    if priv not in TABLE_PRIVILEGES:
        raise AccessError(f"privilege {spec.privilege!r} is not one of {', '.join(TABLE_PRIVILEGES)}")
    if spec.columns and priv not in COLUMN_PRIVILEGES:
        raise AccessError(f"{priv} is granted on whole tables only (column privileges: {', '.join(COLUMN_PRIVILEGES)})")
    grantee = cat.roles[g].name
    for rel in dict.fromkeys(_resolve_rel(cat, t) for t in spec.tables):
        r = cat.rels[rel]
        plan.tables.append(r.display)
        names = [c for c, _ in cols[rel]]
        if spec.columns:
            want = []
            for c in spec.columns:
                col = parse_name(c)
                if col not in names:
                    near = [n for n in names if n.casefold() == col.casefold()]
                    raise AccessError(f"table {r.display} has no column {c!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
                want.append(col)
            new = [c for c in dict.fromkeys(want) if not direct.has_column(rel, c, priv)]
            plan.held += [f"{priv} ({c}) on {r.display}" for c in dict.fromkeys(want) if c not in new]
            if new:
                plan.column += [(rel, c, priv) for c in new]
                plan.statements.append(_grant_table(priv, r.schema, r.name, grantee, new))
                plan.rollback.append(_grant_table(priv, r.schema, r.name, grantee, new, revoke=True))
            continue
        if direct.has_table(rel, priv):
            plan.held.append(f"{priv} on {r.display}")
            continue
        plan.table.append((rel, priv))
        plan.statements.append(_grant_table(priv, r.schema, r.name, grantee))
        plan.rollback.append(_grant_table(priv, r.schema, r.name, grantee, revoke=True))
        had = [a for a in names if direct.has_column(rel, a, priv)] if priv in COLUMN_PRIVILEGES else []
        if had:  # a table-level REVOKE takes these away too: give them back after it
            plan.restore.append(_grant_table(priv, r.schema, r.name, grantee, had))
            plan.notes.append(f"{grantee} holds {priv} on columns {', '.join(had)} of {r.display} by a grant of its own; "
                              "the table-level revoke would take them too, so the rollback grants them back")


def _taken_over(taking_over: Sequence[EngineDryRun], g: int) -> tuple[set, set, set]:
    edges, table, column = set(), set(), set()
    for t in taking_over:
        st = t.state
        if st.get("grantee_oid") != g:
            continue
        edges |= {tuple(x) for x in st.get("added_edges", [])}
        table |= {tuple(x) for x in st.get("added_table", [])}
        column |= {tuple(x) for x in st.get("added_column", [])}
    return edges, table, column


def dry_run(db: Database, spec: AccessSpec, grantee: str, *, expires_at: dt.datetime, valid_until: bool = True,
            taking_over: Sequence[EngineDryRun] = ()) -> EngineDryRun:
    """What granting ``spec`` to role ``grantee`` opens (module docstring); nothing is run.

    Args:
        db: the database (its user needs only to read the catalog).
        spec: the request.
        grantee: the grantee's role name, exactly.
        expires_at: the grant's end (the ``VALID UNTIL`` of a login role).
        valid_until: give a login role ``VALID UNTIL`` the grant's end.
        taking_over: dry-runs of active grants this one extends: what they granted counts as not held.

    Raises:
        AccessError: no such role, table or column; a name PostgreSQL would fold to another; a
            superuser reachable; a privilege that does not exist.
    """
    if bool(spec.role) == bool(spec.tables):
        raise AccessError("ask for a role (--grant) or for tables (--tables), not both and not neither")
    cat = Catalog.load(db)
    me = cat.role(grantee)
    if me is None:
        near = cat.similar_roles(grantee)
        raise AccessError(f"no role {grantee!r} on this server for the grantee" + (
            f"; did you mean {', '.join(near)}?" if near else "; create it, or set access.role_name in the domains file"))
    g = me.oid
    prior_edges, prior_table, prior_column = _taken_over(taking_over, g)
    base = [e for e in cat.edges if (e.role, e.member) not in prior_edges]
    plan = _Plan()
    if spec.role:
        _plan_role(cat, spec, g, base, plan)
    after_edges = base + plan.edges
    before_reach, after_reach = cat.reach_roles(g, base), cat.reach_roles(g, after_edges)
    for r in set(after_reach) - set(before_reach):
        if cat.roles[r].superuser:
            raise AccessError(f"after this grant {grantee} could act as superuser {cat.roles[r].name} "
                              f"({after_reach[r][0]} through {cat.name(after_reach[r][1])}): not an access request")
    acls = Acls.load(db, {*before_reach, *after_reach})
    queries = list(acls.queries)
    requested = [_resolve_rel(cat, t) for t in spec.tables]
    drop = {"drop_table": prior_table, "drop_column": prior_column, "grantee": g}
    direct = held_by(cat, acls, frozenset({g}), **drop)
    direct.table = {k: v for k, v in direct.table.items() if k in {(rel, p) for rel, p, _ in acls.table.get(g, [])}}
    direct.column = {k: v for k, v in direct.column.items() if k in {(rel, a, p) for rel, a, p, _ in acls.column.get(g, [])}}
    cols = columns_of(db, requested)
    if spec.tables:
        _plan_tables(cat, spec, g, direct, cols, plan)
    before = held_by(cat, acls, cat.privs_of(g, base), **drop)
    after = held_by(cat, acls, cat.privs_of(g, after_edges), extra_table=plan.table, extra_column=plan.column, **drop)
    any_before = held_by(cat, acls, frozenset(before_reach), **drop)
    any_after = held_by(cat, acls, frozenset(after_reach), extra_table=plan.table, extra_column=plan.column, **drop)
    touched = ({r for r, _ in after.table} | {r for r, _, _ in after.column} | {r for r, _ in any_after.table}
               | {r for r, _, _ in any_after.column})
    need = {r for r in touched if r not in cols}
    cols.update(columns_of(db, need))
    newly = _diff(cat, before, after, cols)
    shown = {(x.table, x.privilege): set(x.columns) | ({"*"} if x.table_level else set()) for x in newly}
    also = []
    for x in _diff(cat, any_before, any_after, cols):
        have = shown.get((x.table, x.privilege), set())
        rest = [c for c in x.columns if c not in have]
        if rest or (x.table_level and "*" not in have):
            how, via = _provider(cat, acls, after_reach, x)
            also.append(x.model_copy(update={"columns": rest, "table_level": x.table_level and "*" not in have,
                                             "how": how, "via": via}))
    future = [FutureGrant(schema_name=schema, creator=cat.name(creator), privilege=priv, via=cat.name(grantee_oid))
              for creator, schema, grantee_oid, priv in acls.default
              if grantee_oid in after_reach and grantee_oid not in before_reach]
    notes = list(plan.notes) + _notes(cat, after, newly, also, g)
    statements, rollback = list(plan.statements), list(plan.rollback)
    state: dict[str, Any] = {"grantee_oid": g, "grantee": me.name, "role_oid": plan.role_oid,
                             "added_edges": [[e.role, e.member] for e in plan.edges],
                             "added_table": [list(x) for x in plan.table], "added_column": [list(x) for x in plan.column],
                             "rels": {str(r): cat.rels[r].display for r in touched | set(requested) if r in cat.rels},
                             "login": me.login, "valid_until": None}
    previous = me.valid_until
    for t in taking_over:  # an extension: the earlier grant set VALID UNTIL; what it put back is what counts
        vu = t.state.get("valid_until") if t.state.get("grantee_oid") == g else None
        if vu:
            previous = dt.datetime.fromisoformat(vu["previous"]) if vu.get("previous") else None
    if statements and valid_until and me.login and (previous is None or previous > expires_at):
        statements.append(valid_until_sql(me.name, expires_at))
        rollback.append(valid_until_sql(me.name, previous))
        state["valid_until"] = {"set": expires_at.isoformat(), "previous": previous.isoformat() if previous else None}
        notes.append(f"{me.name} can log in: VALID UNTIL {expires_at.isoformat()} is a second line should the revoke not "
                     "happen (it stops password logins only; put back at the revoke)")
    rollback += plan.restore
    return EngineDryRun(engine="postgres", grantee_role=me.name, role=cat.name(plan.role_oid) if plan.role_oid else None,
                        tables=plan.tables, statements=statements if (newly or also or future) else [],
                        rollback=rollback if (newly or also or future) else [], already_held=plan.held,
                        newly_reachable=newly, also_reachable=also, future_tables=future,
                        columns={cat.rels[r].display: cols.get(r, []) for r in sorted(cols) if r in cat.rels
                                 and any(cat.rels[r].display == x.table for x in (*newly, *also))},
                        notes=notes, state=state, queries=queries)


def _provider(cat: Catalog, acls: Acls, reach: dict[int, tuple[str, int]], x: Reachable) -> tuple[str, str | None]:
    """How a privilege of the wider reach comes to the grantee: the first role in reach whose ACL gives it."""
    rel = next((r for r, rel in cat.rels.items() if rel.display == x.table), None)
    for role, (how, via) in sorted(reach.items(), key=lambda kv: kv[0]):
        if how == "privilege":
            continue
        if any(r == rel and p == x.privilege for r, p, _ in acls.table.get(role, ())) or any(
                r == rel and p == x.privilege for r, _, p, _ in acls.column.get(role, ())) or cat.roles[role].name in (
                "pg_read_all_data", "pg_write_all_data"):
            return how, cat.name(via)
    how = next((h for h, _ in reach.values() if h != "privilege"), "set_role")
    return how, None


def _notes(cat: Catalog, after: Held, newly: list[Reachable], also: list[Reachable], g: int) -> list[str]:
    out = []
    no_usage = sorted({x.table.rsplit(".", 1)[0] for x in newly
                       if next((r.schema for r in cat.rels.values() if r.display == x.table), "") not in after.schemas})
    if no_usage and not after.superuser:
        out.append(f"{cat.roles[g].name} has no USAGE on schema(s) {', '.join(no_usage)}: those tables are not readable "
                   "until USAGE is granted as well")
    passing = sorted({x.table for x in newly if x.grant_option})
    if passing:
        out.append(f"the grant carries GRANT OPTION on {', '.join(passing[:10])}: the grantee could pass those privileges "
                   "on, and what it passes on stays after the revoke")
    if any(x.how == "admin" for x in also):
        out.append("WITH ADMIN OPTION is reachable: the grantee could grant itself (or anyone) the roles named in "
                   "also_reachable")
    return out


# -- on the server ---------------------------------------------------------------------------------

def effective(db: Database, grantee_oid: int, items: Sequence[tuple[int, str | None, str]]) -> list[bool | None]:
    """``has_table_privilege`` (column None) / ``has_column_privilege`` of ``grantee_oid`` for each
    ``(relation oid, column, privilege)``, asked of the server (None: the relation is gone)."""
    if not items:
        return []
    rows = exp.values([exp.tuple_(exp.Literal.number(i), exp.Literal.number(rel),
                                  exp.Literal.string(att) if att is not None else exp.Null(), exp.Literal.string(p))
                       for i, (rel, att, p) in enumerate(items)], alias="v", columns=["i", "rel", "att", "priv"])
    tree = sqlglot.parse_one(render(
        "SELECT v.i, CASE WHEN NOT EXISTS(SELECT 1 FROM pg_class AS c WHERE c.oid = CAST(v.rel AS OID)) THEN NULL "
        "WHEN v.att IS NULL THEN has_table_privilege(CAST(:g AS OID), CAST(v.rel AS OID), v.priv) "
        "ELSE has_column_privilege(CAST(:g AS OID), CAST(v.rel AS OID), CAST(v.att AS TEXT), v.priv) END "
        "FROM v_rows ORDER BY v.i", g=grantee_oid), read="postgres")
    next(t for t in tree.find_all(exp.Table) if t.name == "v_rows").replace(rows)
    q = tree.sql("postgres")
    return [None if r[1] is None else bool(r[1]) for r in db.fetch_all(q)]


def _items(state: dict, reach: Iterable[Reachable]) -> tuple[list[tuple[int, str | None, str]], list[str]]:
    rels = {v: int(k) for k, v in (state.get("rels") or {}).items()}
    items, labels = [], []
    for x in reach:
        rel = rels.get(x.table)
        if rel is None:
            continue
        if x.table_level:
            items.append((rel, None, x.privilege))
            labels.append(f"has_table_privilege({state['grantee']}, {x.table}, {x.privilege})")
        for c in x.columns:
            items.append((rel, c, x.privilege))
            labels.append(f"has_column_privilege({state['grantee']}, {x.table}, {c}, {x.privilege})")
    return items, labels


def apply_grant(db: Database, run: EngineDryRun, statements: Sequence[str]) -> dict[str, Any]:
    """Run the approved statements in one transaction, then check on the server that every newly
    reachable privilege is held.

    Raises:
        AccessError: the grantee role is not the one the dry-run saw (dropped, re-created) or the
            server does not show the grant after it ran.
        DatabaseError: a statement failed (nothing of it kept).
    """
    st = run.state
    cat = Catalog.load(db)
    if cat.roles.get(st["grantee_oid"]) is None or cat.roles[st["grantee_oid"]].name != st["grantee"]:
        raise AccessError(f"role {st['grantee']} is not the role the dry-run saw (oid {st['grantee_oid']}): it was dropped, "
                          "renamed or re-created; nothing granted, ask again")
    db.execute_many(list(statements))  # type: ignore[attr-defined]
    items, labels = _items(st, run.newly_reachable)
    got = effective(db, st["grantee_oid"], items)
    missing = [lab for lab, v in zip(labels, got) if v is not True]
    if missing:
        raise AccessError(f"the server does not show the grant after it ran: {'; '.join(missing[:5])}")
    return {"checks": [{"check": lab, "value": v, "expected": True} for lab, v in zip(labels, got)]}


def _member(db: Database, role: int, member: int) -> bool:
    q = render("SELECT COUNT(*) FROM pg_auth_members WHERE roleid = CAST(:r AS OID) AND member = CAST(:m AS OID)",
               r=role, m=member)
    return int(db.fetch_all(q)[0][0]) > 0


def _acl_left(db: Database, g: int, table: Sequence[Sequence], column: Sequence[Sequence]) -> list[str]:
    left = []
    for rel, priv in table:
        q = render("SELECT COUNT(*) FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a WHERE c.oid = "
                   "CAST(:rel AS OID) AND a.grantee = CAST(:g AS OID) AND a.privilege_type = :p", rel=int(rel), g=g, p=priv)
        if int(db.fetch_all(q)[0][0]):
            left.append(f"{priv} on relation {rel}")
    for rel, att, priv in column:
        q = render("SELECT COUNT(*) FROM pg_attribute AS at CROSS JOIN LATERAL aclexplode(at.attacl) AS a WHERE at.attrelid = "
                   "CAST(:rel AS OID) AND at.attname = :att AND a.grantee = CAST(:g AS OID) AND a.privilege_type = :p",
                   rel=int(rel), att=att, g=g, p=priv)
        if int(db.fetch_all(q)[0][0]):
            left.append(f"{priv} ({att}) on relation {rel}")
    return left


def apply_revoke(db: Database, run: EngineDryRun, *, end_sessions: bool) -> dict[str, Any]:
    """Revoke what the grant added (by the roles' and tables' oids, so a renamed role is still
    found and a re-created one is left alone), end the grantee's sessions when asked, put back
    ``VALID UNTIL``, and verify on the server.

    Returns:
        ``{verified, checks, statements, sessions_ended, notes}``: ``verified`` is True when the
        grant's own memberships and ACL entries are gone and none of ``newly_reachable`` is held.

    Raises:
        DatabaseError: a statement failed (nothing of the revoke kept); the caller retries.
    """
    st = run.state
    g = st["grantee_oid"]
    cat = Catalog.load(db)
    notes: list[str] = []
    me = cat.roles.get(g)
    if me is None:
        return {"verified": True, "checks": [{"check": f"role {st['grantee']} (oid {g}) exists", "value": False,
                                              "expected": False}],
                "statements": [], "sessions_ended": 0,
                "notes": [f"role {st['grantee']} (oid {g}) no longer exists: its grants went with it; nothing to revoke"
                          + ("" if cat.role(st["grantee"]) is None else " (a new role of that name is left alone)")]}
    statements = []
    for role, member in st.get("added_edges", []):
        if role in cat.roles:
            statements.append(revoke_role_sql(cat.roles[role].name, me.name))
        else:
            notes.append(f"the granted role (oid {role}) was dropped meanwhile; its membership went with it")
    for rel, priv in st.get("added_table", []):
        if rel in cat.rels:
            r = cat.rels[rel]
            statements.append(_grant_table(priv, r.schema, r.name, me.name, revoke=True))
    by_rel: dict[tuple[int, str], list[str]] = {}
    for rel, att, priv in st.get("added_column", []):
        by_rel.setdefault((rel, priv), []).append(att)
    for (rel, priv), atts in by_rel.items():
        if rel in cat.rels:
            r = cat.rels[rel]
            statements.append(_grant_table(priv, r.schema, r.name, me.name, atts, revoke=True))
    vu = st.get("valid_until")
    if vu:
        prev = dt.datetime.fromisoformat(vu["previous"]) if vu.get("previous") else None
        statements.append(valid_until_sql(me.name, prev))
    statements += [s for s in run.rollback if s.startswith("GRANT ")]  # column privileges held before, given back
    if me.name != st["grantee"]:
        notes.append(f"role {st['grantee']} was renamed {me.name} meanwhile; revoked from it by its oid")
    if statements:
        db.execute_many(statements)  # type: ignore[attr-defined]
    ended = 0
    if end_sessions:
        ended = int(db.fetch_all(render(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usesysid = CAST(:g AS OID) "
            "AND pid <> pg_backend_pid()", g=g))[0][0])
    return {**verify_revoked(db, run), "statements": statements, "sessions_ended": ended,
            "notes": notes}


def verify_revoked(db: Database, run: EngineDryRun) -> dict[str, Any]:
    """Ask the server whether the grant is gone: memberships and ACL entries it added, and
    ``has_table_privilege`` / ``has_column_privilege`` for everything it newly opened (and what it
    opened through SET ROLE or WITH ADMIN)."""
    st = run.state
    g = st["grantee_oid"]
    if not int(db.fetch_all(render("SELECT COUNT(*) FROM pg_roles WHERE oid = CAST(:g AS OID)", g=g))[0][0]):
        return {"verified": True, "checks": [{"check": f"role {st['grantee']} (oid {g}) exists", "value": False,
                                              "expected": False}]}
    checks = []
    for role, member in st.get("added_edges", []):
        still = _member(db, role, member)
        checks.append({"check": f"pg_auth_members: {st['grantee']} member of oid {role}", "value": still, "expected": False})
    for left in _acl_left(db, g, st.get("added_table", []), st.get("added_column", [])):
        checks.append({"check": f"ACL entry of {st['grantee']}: {left}", "value": True, "expected": False})
    items, labels = _items(st, run.newly_reachable)
    for lab, v in zip(labels, effective(db, g, items)):
        checks.append({"check": lab, "value": v, "expected": False})
    return {"verified": all(c["value"] in (False, None) for c in checks), "checks": checks}


__all__ = ["apply_grant", "apply_revoke", "columns_of", "dry_run", "effective", "grant_role_sql", "parse_name",
           "parse_table", "revoke_role_sql", "valid_until_sql", "verify_revoked"]
