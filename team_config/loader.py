"""Read and validate team files; turn every mistake into one line a person can act on."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ValidationError

from team_config.model import NAME_PATTERN, PATTERN_EXAMPLES, TeamConfig
from team_config.text import not_utf8

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


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    """The pydantic model that owns the last key of ``loc`` (to list allowed keys)."""
    model: Any = TeamConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        for candidate in (ann, *getattr(ann, "__args__", ())):
            for inner in (candidate, *getattr(candidate, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
                    break
            else:
                continue
            break
        else:
            return None
    return model


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc)
        allowed = sorted(model.model_fields) if model else []
        guess = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        return f"unknown key '{key}': {hint}allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return "required key is missing"
    if kind == "string_pattern_mismatch":
        example = PATTERN_EXAMPLES.get(error["ctx"]["pattern"])
        return f"{error['input']!r} does not match the required form {error['ctx']['pattern']}" + (
            f"; use {example}" if example else ""
        )
    msg = str(error["msg"])
    msg = re.sub(r"^Value error, ", "", msg)
    if isinstance(error["input"], bool) and kind in ("int_type", "float_type"):
        return f"{msg}, got {error['input']} (YAML reads yes/no/on/off/true/false as booleans); write a number"
    return (
        f"{msg} (got {error['input']!r})"
        if kind not in ("value_error",) and not isinstance(error["input"], dict)
        else msg
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys in a mapping; a team file with ``clusters:`` twice would silently
    drop the first list (and, deployed, delete those clusters). This loader refuses the second key instead.
    A merge key (``<<: *defaults``) is not a key of the mapping: the keys written next to it override the merged
    ones, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):  # a complex key (`? [a, b]`): no key of a team file is one
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise ConfigError(f"line {line}: a key is a {kind}, not a name; write a plain key such as max_nodes:")
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"line {line}: key '{key}' appears twice in one mapping (first at line {seen[key]}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_team(path: Path) -> Team:
    name = path.stem
    if not re.match(NAME_PATTERN, name):
        raise ConfigError(
            f"{path}: team name '{name}' (from the file name) is not DNS-safe; rename the file to "
            "lowercase letters, digits and '-', starting with a letter, at most 32 characters"
        )
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
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
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys (clusters:, network:, ...), got {type(raw).__name__}")
    try:
        config = TeamConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = _loc(tuple(error["loc"]))
            lines.append(f"{path}: {field + ': ' if field else ''}{_describe(error)}")
        raise ConfigError("\n".join(lines)) from None
    return Team(name=name, path=path, config=config)


def load_teams(teams_dir: Path, only: Optional[str] = None) -> list[Team]:
    """Every ``*.yaml``/``*.yml`` in ``teams_dir`` (or just team ``only``), default team first."""
    if not teams_dir.is_dir():
        raise ConfigError(f"{teams_dir}: no such directory; give the folder of the team files (-c teams_dir=...)")
    files = sorted([*teams_dir.glob("*.yaml"), *teams_dir.glob("*.yml")])
    for odd in sorted(teams_dir.iterdir()):
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
        raise ConfigError(f"{teams_dir}: no team files (*.yaml); add teams/{DEFAULT_TEAM}.yaml")
    errors: list[str] = []
    teams: list[Team] = []
    for f in files:
        try:
            teams.append(load_team(f))
        except ConfigError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return sorted(teams, key=lambda t: (t.name != DEFAULT_TEAM, t.name))
