"""The corpus's metadata: every test module of ``field_cases`` declares ``KINDS``, a list of
:func:`kind` dicts; :func:`table` renders them as the docs page's table
(``docs/guides/field-cases.md``, checked by ``test_kinds_table.py``)."""

import importlib
import pkgutil

AREAS = ("time", "types", "changes", "partitions", "vendors", "dependencies", "ownership", "oracle")


def kind(id: str, area: str, title: str, source: str, handled: str, test: str, fixed: bool) -> dict:
    """One failure kind: ``source`` is the public report's link, ``handled`` the module that
    answers it, ``test`` the test function, ``fixed`` whether the library needed a change."""
    assert area in AREAS, area
    assert source.startswith("https://"), source
    return {"id": id, "area": area, "title": title, "source": source, "handled": handled, "test": test, "fixed": fixed}


def all_kinds() -> list[dict]:
    import dw_dagster_tests.field_cases as pkg

    out = []
    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if m.name.startswith("test_"):
            mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
            out += [dict(k, module=m.name) for k in getattr(mod, "KINDS", [])]
    return out


def table(kinds: list[dict]) -> str:
    rows = ["| # | Kind | Area | Source | Where it is handled | Test | Library fix |", "|---|---|---|---|---|---|---|"]
    for i, k in enumerate(kinds, 1):
        src = k["source"].removeprefix("https://github.com/")
        rows.append(f"| {i} | {k['title']} | {k['area']} | [{src}]({k['source']}) | `{k['handled']}` | "
                    f"`field_cases/{k['module']}.py::{k['test']}` | {'yes' if k['fixed'] else 'no'} |")
    n_fixed = sum(k["fixed"] for k in kinds)
    return "\n".join(rows) + f"\n\n{len(kinds)} kinds; {n_fixed} needed a change in the library.\n"
