"""Dagster's private APIs are used from one module, on the Dagster versions they were checked on.

A private name can move or change in any Dagster release; pinning them here makes an upgrade fail
this test first instead of a sensor tick in production.
"""

import ast
from pathlib import Path

import dagster as dg

import dw_dagster
from dw_dagster import dagster_private

PACKAGE = Path(dw_dagster.__file__).parent


def test_every_private_name_still_imports_on_the_installed_dagster():
    assert ".".join(dg.__version__.split(".")[:2]) in dagster_private.CHECKED_ON, (
        f"dagster {dg.__version__} is not among the versions dw_dagster's private imports were checked on "
        f"({dagster_private.CHECKED_ON}): check each name of dw_dagster/dagster_private.py, then add the version")
    for name in dagster_private.PRIVATE:
        assert getattr(dagster_private, name) is not None, name


def test_no_other_library_module_imports_dagster_privates():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "dagster_private.py" or rel.startswith(("examples/", "testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            offenders += [f"{rel}:{node.lineno} {m}" for m in mods if m.startswith("dagster._")]
    assert offenders == []
