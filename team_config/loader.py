"""Read and validate team files; turn every mistake into one line a person can act on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import ValidationError

from team_config.model import NAME_PATTERN, TeamConfig
from team_config.resolve_snapshots import stale_snapshot_ids
from team_config.text import not_utf8
from team_config.validation_errors import error_lines

DEFAULT_TEAM = "default"
STACK_PREFIX = "TrainingStack"


class ConfigError(Exception):
    """A team file is wrong. ``str()`` is one line per problem: file, field, what, fix."""


@dataclass(frozen=True)
class Team:
    name: str
    path: Path
    config: TeamConfig

    @property
    def stack_name(self) -> str:
        return STACK_PREFIX if self.name == DEFAULT_TEAM else f"{STACK_PREFIX}-{self.name}"


LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")  # YAML 1.1: octal when the digits are 0-7, else text


def _without_leading_zeros(text: str) -> str:
    """``-010`` -> ``-10``: the number as meant, in decimal."""
    sign = "-" if text.startswith("-") else ""
    return sign + (text.replace("_", "").lstrip("+-").lstrip("0") or "0")


OTHER_BASE = re.compile(r"[-+]?0[xXbB][0-9a-fA-F_]+")


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys in a mapping; a team file with ``clusters:`` twice would silently
    drop the first list (and, deployed, delete those clusters). This loader refuses the second key instead (a
    ``ConfigError``; trainctl's price files are read with it too).
    A merge key (``<<: *defaults``) is not a key of the mapping: the keys written next to it override the merged
    ones, as YAML intends."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.key_nodes: set[yaml.Node] = set()  # mapping keys: names, read as written

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An int, but YAML 1.1's octal, hexadecimal and binary ones are refused: ``0200`` would be 128."""
        value = int(super().construct_yaml_int(node))
        if LEADING_ZERO.fullmatch(node.value):
            fix = _without_leading_zeros(node.value)
            raise ConfigError(
                f"line {node.start_mark.line + 1}: {node.value} is octal to YAML ({value}); write {fix} without the "
                f"leading 0 (or {value})"
            )
        if OTHER_BASE.fullmatch(node.value):
            base = "hexadecimal" if "x" in node.value.lower() else "binary"
            raise ConfigError(f"line {node.start_mark.line + 1}: {node.value} is {base} to YAML; write {value}")
        return value

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        """Text, but a plain (unquoted) number with a leading 0 that is no octal (``029400``) is refused: YAML read
        it as text, and the model would call it a number in quotes."""
        if node.style is None and LEADING_ZERO.fullmatch(node.value) and node not in self.key_nodes:
            fix = _without_leading_zeros(node.value)
            raise ConfigError(
                f"line {node.start_mark.line + 1}: {node.value} has a leading 0, so YAML reads it as text; write {fix}"
            )
        return str(super().construct_yaml_str(node))

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):  # a complex key (`? [a, b]`): no key of a team file is one
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise ConfigError(f"line {line}: a key is a {kind}, not a name; write a plain key such as max_nodes:")
            # Every key of a team file is a name: read `123:` or `on:` as the text written (not 123 or True), so
            # that it is reported as an unknown key, with the allowed ones, like any other.
            key_node.tag = "tag:yaml.org,2002:str"
            self.key_nodes.add(key_node)  # a name: 0100: is an unknown key, not a number with a leading 0
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"line {line}: key '{key}' appears twice in one mapping (first at line {seen[key]}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_yaml_int)
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:str", UniqueKeyLoader.construct_yaml_str)


def read_yaml_mapping(path: Path, *, empty: str, keys: str) -> tuple[str, dict[Any, Any]]:
    """The text of YAML file ``path`` and the mapping it holds, read with :class:`UniqueKeyLoader`; a one-line
    :class:`ConfigError` naming the file for a file that cannot be read, is no YAML, is empty (``empty``: what to
    write) or holds no mapping (``keys``: some of the keys it should hold)."""
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}; fix the syntax") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror})") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; {empty}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys ({keys}), got {type(raw).__name__}")
    return text, raw


def load_team(path: Path) -> Team:
    name = path.stem
    if not re.match(NAME_PATTERN, name):
        raise ConfigError(
            f"{path}: team name '{name}' (from the file name) is not DNS-safe; rename the file to "
            "lowercase letters, digits and '-', starting with a letter, at most 32 characters"
        )
    text, raw = read_yaml_mapping(
        path,
        empty="write the team's settings (at least clusters:), as in teams/default.yaml",
        keys="clusters:, network:, ...",
    )
    try:
        config = TeamConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in error_lines(exc.errors()))) from None
    stale = stale_snapshot_ids(text, path)
    if stale:
        raise ConfigError("\n".join(f"{path}: {line}" for line in stale))
    return Team(name=name, path=path, config=config)


def load_teams(teams_dir: Path, only: Optional[str] = None) -> list[Team]:
    """Every ``*.yaml``/``*.yml`` in ``teams_dir`` (or just team ``only``), default team first. Dotfiles are not
    team files: an editor's lock or backup (Emacs's ``.#default.yaml``) is skipped."""
    errors: list[str] = []
    teams: list[Team] = []
    for f in _team_files(teams_dir, only):
        try:
            teams.append(load_team(f))
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return sorted(teams, key=lambda t: (t.name != DEFAULT_TEAM, t.name))


def _team_files(teams_dir: Path, only: Optional[str]) -> list[Path]:
    """The team files of ``teams_dir`` (or team ``only``'s); a :class:`ConfigError` for a folder, a file name or a
    team name that is wrong."""
    if not teams_dir.is_dir():
        raise ConfigError(f"{teams_dir}: no such directory; give the folder that holds the team files")
    files = sorted(f for f in [*teams_dir.glob("*.yaml"), *teams_dir.glob("*.yml")] if not f.name.startswith("."))
    for odd in sorted(teams_dir.iterdir()):
        if odd.name.startswith("."):
            continue
        if odd.suffix.lower() in (".yaml", ".yml") and odd.suffix not in (".yaml", ".yml"):
            raise ConfigError(f"{odd}: team files end in .yaml or .yml (lowercase); rename it to {odd.stem}.yaml")
    stems: dict[str, Path] = {}
    for f in files:
        if f.stem in stems:
            raise ConfigError(f"{f}: team '{f.stem}' is also defined by {stems[f.stem]}; keep one file per team")
        stems[f.stem] = f
    if only is not None:
        if only not in stems:
            known = ", ".join(sorted(stems)) or "none"
            raise ConfigError(f"{teams_dir}: no team file for -c team={only}; known teams: {known}")
        files = [stems[only]]
    if not files:
        raise ConfigError(f"{teams_dir}: no team files (*.yaml); add one, e.g. {teams_dir / (DEFAULT_TEAM + '.yaml')}")
    return files
