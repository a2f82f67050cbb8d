"""The documentation site stays true: every code block is a snippet file that a test runs.

Rules (docs/snippets/README.md):

- a fenced code block in ``docs/**/*.md`` holds only ``--8<-- "path"`` include lines;
- every included path exists under ``docs/snippets/``;
- a Python or YAML snippet is named by its path in at least one other test module (the test that
  runs it); a shell snippet is checked here: each ``make`` target exists and each ``dw-dagster``
  command answers ``--help``;
- ``mkdocs build --strict`` passes.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"
TESTS = ROOT / "dw_dagster_tests"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
INCLUDE = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$')


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if SNIPPETS not in p.parents)


def _blocks(page: Path) -> list[str]:
    return [m.group("body") for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def _snippet_files() -> list[Path]:
    return sorted(p for p in SNIPPETS.rglob("*") if p.is_file() and p.name != "README.md")


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_code_block_is_an_existing_snippet(page: Path) -> None:
    for body in _blocks(page):
        lines = [line for line in body.splitlines() if line.strip()]
        assert lines, f"{page.relative_to(ROOT)}: an empty code block"
        for line in lines:
            m = INCLUDE.match(line)
            assert m, f"{page.relative_to(ROOT)}: code block line is not a snippet include: {line!r}"
            assert (SNIPPETS / m.group("path")).is_file(), (
                f"{page.relative_to(ROOT)}: includes {m.group('path')!r}, which is not under docs/snippets/"
            )


def _test_sources() -> str:
    me = Path(__file__).resolve()
    return "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("*.py") if p.resolve() != me)


@pytest.mark.parametrize("snippet", [p for p in _snippet_files() if p.suffix != ".sh"],
                         ids=lambda p: str(p.relative_to(SNIPPETS)))
def test_every_snippet_is_run_by_a_test(snippet: Path) -> None:
    rel = str(snippet.relative_to(SNIPPETS))
    assert rel in _test_sources(), f"docs/snippets/{rel} is named by no test module: write the test that runs it"


def _shell_commands(snippet: Path) -> list[list[str]]:
    """Each command of a shell snippet (continuation lines joined, comments and VAR=value prefixes dropped)."""
    text = snippet.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            argv = [a for a in shlex.split(line) if not ("=" in a and not a.startswith("-") and a.split("=")[0].isupper())]
            if argv:
                out.append(argv)
    return out


CHECKED = {"make", "dw-dagster", "dagster", "dg", "pip"}  # other programs (claude, openssl, export) are not ours to run


def _help(program: str, argv: list[str]) -> subprocess.CompletedProcess:
    words = []
    for a in argv:
        if a.startswith(("-", "[", "$")) or len(words) == 2:
            break
        words.append(a)
    exe = str(Path(sys.executable).with_name(program))
    r = subprocess.run([exe, *words, "--help"], capture_output=True, text=True)
    if r.returncode != 0 and len(words) == 2:  # the second word was an argument, not a command
        r = subprocess.run([exe, words[0], "--help"], capture_output=True, text=True)
    return r


def _check_pip_install(snippet: Path, argv: list[str]) -> None:
    """`pip install dw-dagster[extras]`: the package is ours and every extra exists in pyproject.toml;
    any other package named is one pyproject.toml itself requires (e.g. ``dagster-dg-cli``), and ``.``
    is the user's own project."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    known = {re.split(r"[<>=~!\[; ]", r, maxsplit=1)[0].lower()
             for r in [*project["dependencies"], *(d for ds in project["optional-dependencies"].values() for d in ds)]}
    for req in [a for a in argv[2:] if not a.startswith("-") and a != "."]:
        name, _, extras = req.partition("[")
        if name != project["name"]:
            assert name.lower() in known, f"{snippet.name}: installs {name!r}, neither {project['name']!r} nor a requirement of it"
            continue
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in project["optional-dependencies"], f"{snippet.name}: no extra {extra!r}"


@pytest.mark.parametrize("snippet", [p for p in _snippet_files() if p.suffix == ".sh"],
                         ids=lambda p: str(p.relative_to(SNIPPETS)))
def test_shell_snippet_commands_exist(snippet: Path) -> None:
    """Every `make` target exists; every dw-dagster, dagster and dg (sub)command answers --help."""
    for argv in _shell_commands(snippet):
        program = Path(argv[0]).name
        if program not in CHECKED:
            continue
        if program == "pip":
            _check_pip_install(snippet, argv)
            continue
        if program == "make":
            targets = [a for a in argv[1:] if not a.startswith("-")]
            r = subprocess.run(["make", "-n", "-C", str(ROOT), *targets], capture_output=True, text=True)
            assert r.returncode == 0, f"{snippet.name}: make {targets}: {r.stderr}"
            continue
        r = _help(program, argv[1:])
        assert r.returncode == 0, f"{snippet.name}: {' '.join(argv)}: {r.stderr[-500:]}"
        for flag in [a.strip("[]").split("=")[0] for a in argv if a.strip("[").startswith("--")]:
            assert flag in r.stdout, f"{snippet.name}: {program} has no option {flag}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").is_file()


README = ROOT / "README.md"
MARKER = re.compile(r"<!-- snippet: (?P<path>[^ ]+) -->\n(?P<fence>```+)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$", re.M | re.S)


def test_readme_is_short_and_its_code_blocks_are_snippets() -> None:
    """README.md: at most 150 lines; every code block is marked as a snippet and equals that file."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines (at most 150)"
    marked = list(MARKER.finditer(text))
    assert len(marked) == len(FENCE.findall(text)), "a README code block without a <!-- snippet: ... --> marker"
    for m in marked:
        assert m.group("body") == (SNIPPETS / m.group("path")).read_text(encoding="utf-8"), (
            f"README.md's block differs from docs/snippets/{m.group('path')}")
