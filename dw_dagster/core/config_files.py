"""Reading YAML configuration files into pydantic models, with errors that name the file and line."""

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def _node_at(node: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The deepest YAML node along a pydantic error location (mapping keys and sequence indexes)."""
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if nxt is None:
                return node
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def _dotted_problems(msg: str) -> list[tuple[tuple[Any, ...], str]]:
    """``[(path parts, problem)]`` of a message made of ``a.0.b: problem`` segments joined by ``; ``
    (each path with at least one dot); [] when the message is not of that form."""
    import re

    segments = re.split(r"; (?=[A-Za-z_]\w*(?:\.\w+)+: )", msg)
    out = []
    for seg in segments:
        m = re.match(r"^([A-Za-z_]\w*(?:\.\w+)+): (.*)$", seg, re.S)
        if m is None:
            return []
        out.append((tuple(int(x) if x.isdigit() else x for x in m.group(1).split(".")), m.group(2)))
    return out


def describe_validation_error(e: ValidationError, text: str, path: str | Path) -> str:
    """One line per error: ``file:line: field.path: message`` (line of the offending YAML node, 1-based)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        root = None
    import re

    lines = []
    for err in e.errors():
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg")).removeprefix("Value error, ")
        dotted = _dotted_problems(msg)
        if dotted:  # a model-level check naming several fields by path ("assets.0.database: ...; ...")
            for parts, problem in dotted:
                node = _node_at(root, (*loc, *parts))
                lines.append(f"{path}:{node.start_mark.line + 1 if node is not None else 1}: "
                             f"{'.'.join(str(p) for p in (*loc, *parts))}: {problem}")
            continue
        # a model-level check that names its field first ("deny_after: ...") points at that field
        named = re.match(r"^([A-Za-z_][A-Za-z0-9_]*): (.*)$", msg, re.S)
        node = _node_at(root, loc)
        if named and isinstance(node, yaml.MappingNode) and any(
                getattr(k, "value", None) == named.group(1) for k, _ in node.value):
            loc, msg = (*loc, named.group(1)), named.group(2)
            node = _node_at(root, loc)
        line = node.start_mark.line + 1 if node is not None else 1
        where = ".".join(str(p) for p in loc) or "(top level)"
        lines.append(f"{path}:{line}: {where}: {msg}")
    return "\n".join(lines)


def resolve_env_refs(data: Any, where: str = "") -> Any:
    """Replace every ``{env: NAME}`` mapping in ``data`` by the value of environment variable NAME
    (``{env: NAME, default: VALUE}``: VALUE when NAME is not set).

    Raises:
        KeyError: a named variable without a default is not set (the message names it and where it is used).
    """
    import os

    if isinstance(data, dict):
        if set(data) in ({"env"}, {"env", "default"}) and isinstance(data["env"], str):
            name = data["env"]
            if name in os.environ:
                return os.environ[name]
            if "default" in data:
                return data["default"]
            raise KeyError(f"{where or '(top level)'}: environment variable {name} is not set")
        return {k: resolve_env_refs(v, f"{where}.{k}" if where else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [resolve_env_refs(v, f"{where}[{i}]") for i, v in enumerate(data)]
    return data


def read_yaml_model(path: str | Path, model: type[M], error: type[Exception], what: str, *,
                    resolve_env: bool = False) -> M:
    """Parse ``path`` as YAML and validate it as ``model``.

    With ``resolve_env``, ``{env: NAME}`` values are read from the environment first
    (:func:`resolve_env_refs`).

    Raises:
        error: the file is missing, is not YAML (the message has the line and column), names an
            unset environment variable, or fails validation (one line per problem:
            ``file:line: field: message``).
    """
    p = Path(path)
    try:
        text = p.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError as e:
        raise error(f"{what} not found: {p}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise error(f"{where}: not valid YAML: {str(e).replace(chr(34) + '<unicode string>' + chr(34), str(p))}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{what} {p} cannot be read: {e}") from e
    if data is None:
        raise error(f"{p}:1: the {what} is empty")
    if resolve_env:
        try:
            data = resolve_env_refs(data)
        except KeyError as e:
            raise error(f"{p}: {e.args[0]}") from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{p}: invalid {what}:\n{describe_validation_error(e, text, p)}") from e
