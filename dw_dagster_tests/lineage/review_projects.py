"""Base and head dbt projects for the review tests: a generated project and a copy that differs by known changes.

:func:`write_review_pair` writes a project with
:func:`~dw_dagster_tests.benchmarks.blast_radius.write_synthetic_project` (the base), copies it
(the head) and changes the head the way a pull request would, one change per scenario:

- ``body``: a model's SQL (a ``where`` clause);
- ``drop_column``: a model stops selecting ``ts``, which its children select (breaking);
- ``add_email``: a model gains a ``customer_email`` column (sensitive, not breaking);
- ``rename``: ``cast(amount as double) as amount`` becomes ``... as amount_usd`` (same type and
  position; its children read ``amount``: breaking);
- ``retype``: ``cast(amount as double)`` becomes ``cast(amount as decimal(18,2))`` (breaking);
- ``remove_model``: a model nothing depends on is deleted;
- ``contract``: a model with an enforced contract changes a column's ``data_type`` (dbt: breaking);
- ``macro``: a macro that a macro two models call changes (the models are modified through it);
- ``config``: a model's ``materialized`` set in its properties file;
- ``meta``: a model's ``meta`` changes (dbt compares it: modified);
- ``tags_only``: a model's ``tags`` change (dbt leaves tags out: not modified);
- ``description_only``: a model's description changes, without ``persist_docs`` (not modified);
- ``new_model``: a model (with a test) that was not there;
- ``seed``: a seed's CSV;
- ``test_config``: a ``not_null`` test's ``severity``;
- ``exposure``: an exposure's label changes; ``new_exposure``: one is added (dbt: not modified);
- ``source``: a source table's ``freshness``; ``new_source``: a source table is added (dbt: not modified);
- ``unit_test``: a unit test's expected rows (when the project has unit tests).

The scenarios pick distinct models, none a child of another's. Both projects are parsed;
``dbt ls`` runs on the head with ``--state`` the base's ``target/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dw_dagster_tests.benchmarks import blast_radius as blast_radius_module
from dw_dagster_tests.benchmarks.blast_radius import PROJECT, SyntheticProject, dbt_ls_many, write_synthetic_project

_REF = re.compile(r"ref\('([^']+)'\)")


@dataclass
class ReviewPair:
    """A base and a head project and what the head changes: ``picked`` maps a scenario to its model name."""

    base: SyntheticProject
    head: SyntheticProject
    picked: dict[str, str] = field(default_factory=dict)

    def uid(self, scenario: str) -> str:
        return f"model.{PROJECT}.{self.picked[scenario]}"


def _load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def _dump(p: Path, doc: dict) -> None:
    p.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))


def _model_files(root: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted((root / "models").glob("layer_*/m*.sql"))}


def _entry(root: Path, name: str) -> tuple[Path, dict, dict]:
    for path in sorted((root / "models").glob("layer_*/schema.yml")):
        doc = _load(path)
        for e in doc.get("models") or ():
            if e["name"] == name:
                return path, doc, e
    raise KeyError(name)


def _rewrite_parts(text: str, new_select: str) -> str:
    """Replace the ``select id, amount, ts`` of every union part."""
    return text.replace("select id, amount, ts from", f"select {new_select} from")


def write_review_pair(root: Path, models: int, seed: int) -> ReviewPair:
    """Write ``root/base`` and ``root/head`` (not parsed): see the module docstring."""
    root = Path(root)
    base = write_synthetic_project(root / "base", models=models, seed=seed)
    b = base.project_dir
    files = _model_files(b)
    text = {n: p.read_text() for n, p in files.items()}
    children: dict[str, set[str]] = {n: set() for n in files}
    for n, t in text.items():
        for parent in _REF.findall(t):
            if parent in children:
                children[parent].add(n)
    others = "\n".join(p.read_text() for p in [*b.glob("models/*.yml"), *b.glob("tests/*.sql"), *b.glob("snapshots/*.yml"),
                                                *b.glob("analyses/*.sql"), *b.glob("models/layer_*/schema.yml")])
    referenced_elsewhere = set(_REF.findall(others)) | {m for m in re.findall(r"model: (m\d+)", others)}
    plain = sorted(n for n, t in text.items() if "ephemeral" not in t and "select id, amount, ts from" in t)
    with_children = [n for n in plain if any("ephemeral" not in text[c] for c in children[n])]
    picked: dict[str, str] = {}
    taken: set[str] = set()

    def pick(scenario: str, pool: list[str]) -> str:
        for n in pool[len(pool) // 3:] + pool[: len(pool) // 3]:
            if n in taken or children[n] & taken or any(n in children[t] for t in taken):
                continue
            if n in referenced_elsewhere and scenario != "body":
                continue
            picked[scenario] = n
            taken.add(n)
            taken.update(children[n])
            return n
        raise RuntimeError(f"no model left for {scenario}")

    for scenario in ("drop_column", "rename", "retype"):
        pick(scenario, with_children)
    leaves = [n for n in plain if not children[n] and n not in referenced_elsewhere]
    pick("remove_model", leaves)
    for scenario in ("body", "add_email", "contract", "macro", "macro2", "config", "meta", "tags_only", "description_only"):
        pick(scenario, plain)

    # base-side setup the scenarios need: casts to rename/retype, the macro, the contract
    for scenario in ("rename", "retype"):
        n = picked[scenario]
        files[n].write_text(_rewrite_parts(text[n], "id, cast(amount as double) as amount, ts"))
    (b / "macros" / "review_macros.sql").write_text("{% macro dw_amount(col) %}{{ dw_inner(col) }}{% endmacro %}\n"
                                                    "{% macro dw_inner(col) %}{{ col }}{% endmacro %}\n")
    for scenario in ("macro", "macro2"):
        n = picked[scenario]
        files[n].write_text(_rewrite_parts(text[n], "id, {{ dw_amount('amount') }} as amount, ts"))
    path, doc, e = _entry(b, picked["contract"])
    ids = [c for c in e.get("columns") or () if c["name"] == "id"]
    e["config"] = {**(e.get("config") or {}), "contract": {"enforced": True}, "materialized": "table"}
    e["columns"] = [{**(ids[0] if ids else {"name": "id"}), "data_type": "integer"},
                    {"name": "amount", "data_type": "double"}, {"name": "ts", "data_type": "date"}]
    _dump(path, doc)
    path, doc, e = _entry(b, picked["meta"])
    e["config"] = {**(e.get("config") or {}), "meta": {"owner": "before@corp.example"}}
    _dump(path, doc)

    head_dir = root / "head"
    shutil.copytree(b, head_dir, ignore=shutil.ignore_patterns("target", "logs", "*.duckdb"))
    head = SyntheticProject(project_dir=head_dir, models=models, selectors=dict(base.selectors))
    h = head_dir
    hfiles = _model_files(h)

    def edit(scenario: str, fn) -> None:
        p = hfiles[picked[scenario]]
        p.write_text(fn(p.read_text()))

    edit("body", lambda t: t.rstrip("\n") + "\nwhere id is not null\n" if "union all" not in t
         else "select * from (\n" + t.rstrip("\n") + "\n) where id is not null\n")
    edit("drop_column", lambda t: _rewrite_parts(t, "id, amount"))
    edit("add_email", lambda t: _rewrite_parts(t, "id, amount, ts, 'someone@corp.example' as customer_email"))
    edit("rename", lambda t: t.replace("cast(amount as double) as amount,", "cast(amount as double) as amount_usd,"))
    edit("retype", lambda t: t.replace("cast(amount as double)", "cast(amount as decimal(18,2))"))
    (h / "macros" / "review_macros.sql").write_text("{% macro dw_amount(col) %}{{ dw_inner(col) }}{% endmacro %}\n"
                                                    "{% macro dw_inner(col) %}({{ col }} * 1){% endmacro %}\n")
    removed = picked["remove_model"]
    hfiles[removed].unlink()
    path, doc, e = _entry(h, removed)
    doc["models"] = [x for x in doc["models"] if x["name"] != removed]
    _dump(path, doc)
    for scenario, change in (("contract", lambda e: e["columns"][1].update(data_type="decimal(18,2)")),
                             ("config", lambda e: e.setdefault("config", {}).update(materialized="table")),
                             ("meta", lambda e: e["config"]["meta"].update(owner="after@corp.example")),
                             ("tags_only", lambda e: e.setdefault("config", {}).update(tags=["reviewed"])),
                             ("description_only", lambda e: e.update(description="Now documented."))):
        path, doc, e = _entry(h, picked[scenario])
        change(e)
        _dump(path, doc)
    # a new model with a test, reading the body-changed model
    new = "m_new_review"
    layer = hfiles[picked["body"]].parent
    (layer / f"{new}.sql").write_text(f"select id, amount, ts from {{{{ ref('{picked['body']}') }}}}\n")
    path = layer / "schema.yml"
    doc = _load(path)
    doc["models"].append({"name": new, "columns": [{"name": "id", "data_tests": ["not_null"]}]})
    _dump(path, doc)
    picked["new_model"] = new
    # a seed's contents
    (h / "seeds" / "seed_stores.csv").write_text("id,label\n1,a\n2,b\n3,c\n")
    # a test's severity: the first model whose id has a not_null test (and is not picked)
    for path in sorted((h / "models").glob("layer_*/schema.yml")):
        doc = _load(path)
        hit = next((e for e in doc["models"] if e["name"] not in taken and any(
            c["name"] == "id" and "not_null" in (c.get("data_tests") or ()) for c in e.get("columns") or ())), None)
        if hit is not None:
            col = next(c for c in hit["columns"] if c["name"] == "id")
            col["data_tests"] = [{"not_null": {"config": {"severity": "warn"}}} if t == "not_null" else t
                                 for t in col["data_tests"]]
            picked["test_config"] = hit["name"]
            _dump(path, doc)
            break
    # exposures: one relabelled, one new
    path = h / "models" / "exposures.yml"
    doc = _load(path)
    doc["exposures"][1]["label"] = "Relabelled dashboard"
    doc["exposures"].append({"name": "dash_review_new", "type": "dashboard", "owner": {"email": "new@corp.example"},
                             "depends_on": [f"ref('{picked['add_email']}')"]})
    _dump(path, doc)
    # sources: one table's freshness, one new table
    path = h / "models" / "sources.yml"
    doc = _load(path)
    doc["sources"][1]["tables"][2]["freshness"] = {"warn_after": {"count": 12, "period": "hour"}}
    doc["sources"][1]["tables"].append({"name": "t_review_new"})
    _dump(path, doc)
    # a unit test's expectation
    for path in sorted((h / "models").glob("layer_*/schema.yml")):
        doc = _load(path)
        if doc.get("unit_tests"):
            doc["unit_tests"][0]["expect"] = {"rows": [{"id": 1, "amount": 3.0}]}
            picked["unit_test"] = doc["unit_tests"][0]["name"]
            _dump(path, doc)
    return ReviewPair(base=base, head=head, picked=picked)


# -- small hand-written pairs: a catalog built by dbt, hostile names ------------------------------


def _project(root: Path, name: str, files: dict[str, str]) -> SyntheticProject:
    """A DuckDB dbt project with ``files`` (path → text) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "dbt_project.yml").write_text(yaml.safe_dump({
        "name": name, "version": "1.0.0", "config-version": 2, "profile": name, "model-paths": ["models"],
        "seed-paths": ["seeds"], "macro-paths": ["macros"], "target-path": "target",
        "models": {name: {"+materialized": "table"}}}))
    (root / "profiles.yml").write_text(yaml.safe_dump({name: {"target": "duckdb", "outputs": {"duckdb": {
        "type": "duckdb", "path": "{{ env_var('DW_WAREHOUSE_PATH', 'w.duckdb') }}", "schema": "main", "threads": 1}}}}))
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return SyntheticProject(project_dir=root, models=sum(1 for k in files if k.startswith("models/") and k.endswith(".sql")))


CATALOG_BASE = {
    "seeds/raw_customers.csv": "id,name,email_address,signup_date,notes\n1,Ann,ann@x.example,2024-01-02,vip\n"
                               "2,Bo,bo@x.example,2024-02-03,\n",
    "models/stg_customers.sql": "select id, name, signup_date from {{ ref('raw_customers') }}\n",
    "models/customers.sql": "select * from {{ ref('stg_customers') }}\n",
    "models/customer_ids.sql": "select id from {{ ref('stg_customers') }}\n",
    "models/schema.yml": yaml.safe_dump({"version": 2, "models": [
        {"name": "stg_customers", "columns": [{"name": "id", "data_tests": ["not_null"]}]},
        {"name": "customers", "config": {"meta": {"owner": "crm@shop.example"}}}]}),
}
CATALOG_HEAD = {
    **CATALOG_BASE,
    "models/stg_customers.sql": "select cast(id as varchar) as id, name as full_name, signup_date, "
                                "email_address as contact_email from {{ ref('raw_customers') }}\n",
}


def write_catalog_pair(root: Path) -> tuple[SyntheticProject, SyntheticProject]:
    """Base and head of a small project dbt builds in DuckDB: in the head, ``stg_customers`` retypes ``id``
    (INTEGER → VARCHAR), renames ``name`` to ``full_name`` and adds ``contact_email``; ``customers``
    reads it with ``select *``, ``customer_ids`` reads ``id``. Each is built (``dbt build``) and
    documented (``dbt docs generate``: ``target/catalog.json``)."""
    base = _project(root / "base", "shop", CATALOG_BASE)
    head = _project(root / "head", "shop", CATALOG_HEAD)
    for p in (base, head):
        p.dbt("build", "--quiet")
        p.dbt("docs", "generate", "--quiet")
    return base, head


HOSTILE_COLUMNS = ['e-mail | <b>x</b>', 'naïve; drop table x; --', 'Home Address', 'col`tick', '[link](http://evil.example)']
_Q = '"'


def _quoted(name: str) -> str:
    return _Q + name.replace(_Q, _Q * 2) + _Q


def write_hostile_pair(root: Path) -> tuple[SyntheticProject, SyntheticProject]:
    """A project whose node and column names are hostile: a unicode model name, a model called ``order``
    (an SQL keyword) and one with a dash, columns with pipes, HTML, quotes, semicolons, backticks,
    spaces and Markdown links. The head adds the hostile columns to ``modèle_données``, drops one
    that ``order`` selects, and documents one with a Markdown/HTML description and ``meta: {pii: true}``."""
    cols_base = ", ".join(f"{i} as {_quoted(c)}" for i, c in enumerate(HOSTILE_COLUMNS[1:2], 1))
    cols_head = ", ".join(f"{i} as {_quoted(c)}" for i, c in enumerate(HOSTILE_COLUMNS, 1) if c != HOSTILE_COLUMNS[1])
    base_files = {
        "models/modèle_données.sql": f"select 1 as id, {cols_base}\n",
        "models/order.sql": f"select id, {_quoted(HOSTILE_COLUMNS[1])} from {{{{ ref('modèle_données') }}}}\n",
        "models/line-items.sql": "select id from {{ ref('order') }}\n",
        "models/schema.yml": yaml.safe_dump({"version": 2, "models": [{"name": "modèle_données"}]}, allow_unicode=True),
    }
    head_files = {
        **base_files,
        "models/modèle_données.sql": f"select 1 as id, {cols_head}\n",
        "models/schema.yml": yaml.safe_dump({"version": 2, "models": [{"name": "modèle_données", "columns": [
            {"name": HOSTILE_COLUMNS[4], "description": "<script>alert(1)</script> **bold** | pipe",
             "config": {"meta": {"pii": True}}}]}]}, allow_unicode=True),
    }
    return _project(root / "base", "hostile", base_files), _project(root / "head", "hostile", head_files)


# -- the cache: dbt's parse and dbt ls are slow; their outputs are kept between test sessions ------

CACHE = Path(tempfile.gettempdir()) / "dw_dagster_review_cache"


def _key(*parts: object) -> str:
    import dbt.version

    h = hashlib.sha256()
    for src in (Path(__file__), Path(blast_radius_module.__file__)):
        h.update(src.read_bytes())
    h.update(str(dbt.version.__version__).encode())
    h.update(json.dumps(parts, default=str).encode())
    return h.hexdigest()[:16]


@dataclass
class Built:
    """What a built pair left in the cache: both targets (``manifest.json``, maybe ``catalog.json``), the
    scenario picks, and dbt's own answers (selector → unique ids)."""

    base: Path
    head: Path
    picked: dict[str, str]
    oracle: dict[str, set[str]]
    size: int = 0

    def manifest(self, side: str) -> dict:
        return json.loads((getattr(self, side) / "manifest.json").read_text())


def _oracle(base: SyntheticProject, head: SyntheticProject, cli_check: bool) -> dict[str, list[str]]:
    state = ["--state", str(base.project_dir / "target")]
    out = dbt_ls_many(head.project_dir, head.env(), ["state:modified", "state:modified+"], extra_args=state)
    result = {k: sorted(v) for k, v in out.items()}
    if cli_check:  # dbt's command line, not the in-process runner
        text = head.dbt("ls", "--quiet", "--select", "state:modified", *state, "--output", "json", "--output-keys",
                        "unique_id").stdout
        result["cli:state:modified"] = sorted(json.loads(x)["unique_id"] for x in text.splitlines() if x.startswith("{"))
    return result


def built(kind: str, work: Path, *, models: int = 0, seed: int = 0) -> Built:
    """Build (or take from :data:`CACHE`) a pair: ``kind`` is ``generated`` (:func:`write_review_pair` with
    ``models``/``seed``), ``catalog`` (:func:`write_catalog_pair`) or ``hostile`` (:func:`write_hostile_pair`).
    Both projects are parsed and dbt answers ``state:modified`` and ``state:modified+`` on the head."""
    key = _key(kind, models, seed)
    done = CACHE / key
    if not (done / "done").exists():
        picked: dict[str, str] = {}
        if kind == "generated":
            pair = write_review_pair(work, models, seed)
            base, head, picked = pair.base, pair.head, pair.picked
        elif kind == "catalog":
            base, head = write_catalog_pair(work)
        else:
            base, head = write_hostile_pair(work)
        for p in (base, head):
            if not (p.project_dir / "target" / "manifest.json").exists() or kind != "catalog":
                p.parse()
        oracle = _oracle(base, head, cli_check=kind != "generated" or models <= 100)
        tmp = CACHE / f"{key}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for side, p in (("base", base), ("head", head)):
            (tmp / side).mkdir(parents=True)
            for name in ("manifest.json", "catalog.json"):
                if (p.project_dir / "target" / name).exists():
                    shutil.copy(p.project_dir / "target" / name, tmp / side / name)
        (tmp / "picked.json").write_text(json.dumps(picked))
        (tmp / "oracle.json").write_text(json.dumps(oracle))
        (tmp / "done").write_text("")
        try:
            tmp.rename(done)
        except OSError:  # another session finished the same pair first
            shutil.rmtree(tmp, ignore_errors=True)
    oracle = {k: set(v) for k, v in json.loads((done / "oracle.json").read_text()).items()}
    return Built(base=done / "base", head=done / "head", picked=json.loads((done / "picked.json").read_text()), oracle=oracle,
                 size=models)
