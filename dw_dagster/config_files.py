"""Reading YAML configuration files into pydantic models, with errors that name the file."""

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def read_yaml_model(path: str | Path, model: type[M], error: type[Exception], what: str) -> M:
    """Parse ``path`` as YAML and validate it as ``model``.

    Raises:
        error: the file is missing, is not YAML, or fails validation (message names the file;
            YAML syntax errors carry the line and column).
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError as e:
        raise error(f"{what} not found: {p}") from e
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {e}") from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"{p}: {e}") from e
