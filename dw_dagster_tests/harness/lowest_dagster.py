"""A cached venv holding the *lowest* Dagster the package allows, for tests that run on both ends.

``pyproject.toml`` allows ``dagster>=1.13,<1.14`` (and the integration libraries of the same
release line, ``>=0.29,<0.30``). The project's own venv holds whatever release ``make install``
resolved (the newest it found); this module builds, once, a venv under ``.cache/`` where every
``dagster*`` requirement of the package is pinned to its lower bound (``dagster==1.13.0``,
``dagster-dbt==0.29.0`` ...) and everything else is resolved as ``pip`` would for a user. The
worktree is put on ``PYTHONPATH`` (dw_dagster itself is not installed there), so the code under
test is the worktree's.

The build runs under a file lock (:func:`~dw_dagster_tests.harness.emulators.build_venv_once`):
concurrent test processes wait for one build and then share it; a changed requirement list
rebuilds it. It takes a few minutes once; later runs reuse it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from dw_dagster_tests.harness.emulators import CACHE_DIR, REPO, VenvBuild, build_venv_once, run_logged

LOWEST_VENV = CACHE_DIR / "dagster-lowest-venv"
#: the extras the lowest venv holds besides the hard dependencies (the MCP server's; the review page and
#: Slack, which the examples' demo homes use)
EXTRAS = ("mcp", "review", "slack")
#: bump to rebuild the venv when the way it is built changes
BUILD = "3"
#: Dagster's own libraries that a pinned ``dagster`` pulls in by exact version (pinned too, to be explicit)
_SAME_RELEASE = ("dagster-graphql", "dagster-pipes", "dagster-shared")


def _lower_bound(spec: str) -> str:
    m = re.search(r">=\s*([0-9][0-9.]*)", spec)
    if m is None:
        raise ValueError(f"{spec!r} has no lower bound to pin")
    parts = m.group(1).split(".")
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def lowest_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The package's requirements (hard ones and :data:`EXTRAS`) with every ``dagster*`` one pinned low."""
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in EXTRAS:
        specs += project["optional-dependencies"][extra]
    examples = tomllib.loads((pyproject.parent / "examples" / "pyproject.toml").read_text())["project"]
    specs += [spec for spec in examples["dependencies"] if not spec.startswith("dw-dagster")]  # the demos' own (dbt-duckdb …)
    out, dagster_version = [], None
    for spec in specs:
        name = re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].strip()
        if name.lower().startswith("dagster"):
            version = _lower_bound(spec)
            if name.lower() == "dagster":
                dagster_version = version
            out.append(f"{name}=={version}")
        else:
            out.append(spec)
    if dagster_version is None:
        raise ValueError("pyproject.toml names no dagster requirement")
    out += [f"{name}=={dagster_version}" for name in _SAME_RELEASE]
    return list(dict.fromkeys(out))


def ensure_lowest_dagster_venv(venv: Path = LOWEST_VENV) -> VenvBuild:
    """Build (once) the venv of :func:`lowest_requirements`; later calls reuse it.

    Raises:
        RuntimeError: the venv or ``pip install`` failed (with the tail of its log).
    """
    requirements = lowest_requirements()

    def build(tmp: Path, log) -> None:
        run_logged([sys.executable, "-m", "venv", str(tmp)], log)
        run_logged([str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                    *requirements], log)
        _point_scripts_at(tmp, venv)

    return build_venv_once(venv, "\n".join([f"# build {BUILD}", *requirements]) + "\n", build, what="the lowest-dagster venv")


def _point_scripts_at(built: Path, final: Path) -> None:
    """Rewrite the console scripts' shebangs (``bin/dbt``, ``bin/dagster`` ...) from the build's
    temporary place to the venv's final one: dagster-dbt runs ``<venv>/bin/dbt``."""
    old, new = f"#!{built}/bin/", f"#!{final}/bin/"
    for script in (built / "bin").iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        try:
            text = script.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if text.startswith(old):
            script.write_text(new + text[len(old):])


if __name__ == "__main__":  # build it ahead of the tests: python -m dw_dagster_tests.harness.lowest_dagster
    build = ensure_lowest_dagster_venv()
    print(build.python, "built in", build.built_seconds, "s" if build.built_seconds is not None else "(reused)")
