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
    out = []
    for raw in snippet.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


@pytest.mark.parametrize("snippet", [p for p in _snippet_files() if p.suffix == ".sh"],
                         ids=lambda p: str(p.relative_to(SNIPPETS)))
def test_shell_snippet_commands_exist(snippet: Path) -> None:
    cli = Path(sys.executable).with_name("dw-dagster")
    for argv in _shell_commands(snippet):
        argv = [a for a in argv if "=" not in a or a.startswith("-")]  # drop VAR=value prefixes
        if argv[0] == "make":
            targets = [a for a in argv[1:] if not a.startswith("-")]
            r = subprocess.run(["make", "-n", "-C", str(ROOT), *targets], capture_output=True, text=True)
            assert r.returncode == 0, f"{snippet.name}: make {targets}: {r.stderr}"
        elif argv[0].endswith("dw-dagster"):
            words = [a for a in argv[1:] if not a.startswith("-")][:2]
            r = subprocess.run([str(cli), *words, "--help"], capture_output=True, text=True)
            if r.returncode != 0 and len(words) == 2:  # the second word was an argument, not a command
                r = subprocess.run([str(cli), words[0], "--help"], capture_output=True, text=True)
            assert r.returncode == 0, f"{snippet.name}: dw-dagster {' '.join(words)} --help: {r.stderr}"


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").is_file()
