"""Reading the files operators write (config, policy, scenarios, rule config, secrets): one path
for every way a file can be wrong, each a one-line message naming the file (and the line of a
YAML error), so that no command answers a typo with a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class FileError(ValueError):
    """A file that cannot be read, is not YAML or is not the shape asked for."""


def parse_yaml(text: str, source: str | Path) -> Any:
    """YAML text read from `source` (a file, or what a template rendered)."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else str(source)
        raise FileError(f"{where}: not YAML ({e.problem or e.context})") from e
    except yaml.YAMLError as e:
        raise FileError(f"{source}: not YAML ({str(e).splitlines()[0]})") from e


def read_text(path: Path, what: str = "file") -> str:
    """The text of `path`; `what` (`policy file`, `scenario`) names it in errors."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise FileError(f"{path}: no such {what}") from e
    except IsADirectoryError as e:
        raise FileError(f"{path}: is a directory, not a {what}") from e
    except OSError as e:
        raise FileError(f"{path}: cannot read the {what} ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise FileError(f"{path}: not a text file ({e.reason} at byte {e.start})") from e


def load_yaml(path: Path, what: str = "file") -> Any:
    """The YAML document in `path`."""
    return parse_yaml(read_text(path, what), path)


def load_mapping(path: Path, what: str = "file") -> dict[str, Any]:
    """`load_yaml` for the files that are a mapping of keys; an empty file is an empty one."""
    data = load_yaml(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FileError(f"{path}: a {what} is a mapping of keys, not {_kind(data)}")
    return data


def _kind(data: Any) -> str:
    if isinstance(data, list):
        return "a list"
    if isinstance(data, str):
        return "a string"
    return f"a {type(data).__name__}"
