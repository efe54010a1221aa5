"""Reading a YAML file for the twin's loaders (scenario, sweep, plan), with errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The parsed document; ``error`` (the loader's own exception) if the file cannot be read or is
    not YAML, its message starting with the path."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML: {exc}") from exc
