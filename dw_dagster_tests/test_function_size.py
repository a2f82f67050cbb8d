"""Small units: no function or method of the ``dw_dagster`` package is over 150 lines of code.

A function's size is the number of lines of its span that carry code: blank lines, comment
lines and its own docstring do not count. Nested functions and classes count inside their
parent, docstrings included: a closure is part of its factory. This sits beside the 750-line
module rule of ``test_public_surface.py``.
"""

import ast
import fnmatch
import importlib.util
import io
import tokenize
from pathlib import Path

PACKAGE = Path(importlib.util.find_spec("dw_dagster").origin).parent  # found, not imported: the test reads source
LIMIT = 150

# split on other branches: (module path glob under dw_dagster/, function name)
HANDLED_ELSEWHERE: set[tuple[str, str]] = set()  # none: every split has landed

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}


def _code_lines(source: str) -> set[int]:
    """The line numbers that carry a token other than a comment or layout."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return set(range(first.lineno, first.end_lineno + 1))
    return set()


def function_sizes(path: Path) -> list[tuple[int, str, int]]:
    """``(line, name, lines of code)`` for every function and method of one module."""
    source = path.read_text()
    code = _code_lines(source)
    return [(node.lineno, node.name,
             len(code.intersection(range(node.lineno, node.end_lineno + 1)) - _docstring_lines(node)))
            for node in ast.walk(ast.parse(source, str(path)))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _exempt(rel: str, name: str) -> bool:
    return any(fnmatch.fnmatch(rel, pattern) and name == fn for pattern, fn in HANDLED_ELSEWHERE)


def test_the_counter_skips_blank_lines_comments_and_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('def f(a):\n    """Doc\n    string."""\n\n    # a comment\n    x = """not\n'
                      'a docstring"""\n    def g():\n        """Nested doc."""\n        return a\n'
                      '    return g  # trailing\n')
    assert sorted(function_sizes(module)) == [(1, "f", 7), (8, "g", 2)]


def test_no_function_is_over_150_lines_of_code():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, name, count in function_sizes(path):
            if count > LIMIT and not _exempt(rel, name):
                over.append(f"dw_dagster/{rel}:{line} {name} {count}")
    assert not over, (f"functions over {LIMIT} lines of code (split them into small functions "
                      f"or classes):\n" + "\n".join(over))
