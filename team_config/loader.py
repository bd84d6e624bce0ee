"""Read and validate team files; turn every mistake into one line a person can act on."""

from __future__ import annotations

import datetime
import decimal
import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ValidationError

from team_config.instance_types import closest_instance_type
from team_config.model import INSTANCE_TYPE_PATTERN, NAME_PATTERN, PATTERN_EXAMPLES, TeamConfig
from team_config.resolve_snapshots import stale_snapshot_ids
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


SHOW_MAX = 80  # characters of a value an error line quotes (YAML anchors can make a value of megabytes)


def _show(value: Any) -> str:
    """A value as the person wrote it in YAML, not as a Python repr (a date is 2024-01-01, not datetime.date(...)),
    cut to ``SHOW_MAX`` characters."""
    text = str(value) if isinstance(value, (datetime.date, datetime.datetime)) else repr(value)
    return text if len(text) <= SHOW_MAX else f"{text[: SHOW_MAX - 3]}..."


def _similar_keys(key: str, allowed: list[str]) -> list[str]:
    """Allowed keys ``key`` may be a typo or a short form of: close spelling, a prefix (``az`` of ``az_count``) or the
    initials (``az`` of ``availability_zone``)."""
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return close
    short = key.lower().rstrip("s")
    if len(short) < 2:
        return []
    return [a for a in allowed if a.startswith(short) or "".join(w[0] for w in a.split("_")) == short]


def _number_hint(value: str) -> Optional[str]:
    """What to write instead of a string that reads as a number: YAML 1.1 reads 1e6 as text (it wants 1.0e+6)."""
    try:
        number = decimal.Decimal(value.strip())
    except decimal.InvalidOperation:
        return None
    if not number.is_finite():
        return None
    if not math.isfinite(float(number)):  # 1e400: no float holds it, and 400 digits are no fix
        return f"got {value!r}, too large to be a number here; write a smaller one"
    plain = format(number, "f")
    if re.fullmatch(r"\s*[-+]?\d+(\.\d+)?\s*", value):
        return f"got {value!r}, a number in quotes; remove the quotes: {plain}"
    return f"got {value!r}, which YAML reads as text, not a number; write {plain}"


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error["input"]
    if kind == "extra_forbidden":
        unknown = str(loc[-1])
        model = _model_at(loc)
        allowed = sorted(model.model_fields) if model else []
        guesses = _similar_keys(unknown, allowed)
        hint = f"did you mean {' or '.join(repr(g) for g in guesses)}? " if guesses else ""
        return f"unknown key '{unknown}': {hint}allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"required key is missing; add {loc[-1]}: (see docs/reference/team-file.md)"
    if kind == "string_pattern_mismatch":
        pattern = error["ctx"]["pattern"]
        if pattern == INSTANCE_TYPE_PATTERN:
            guess = closest_instance_type(str(value))
            if guess:
                return f"{value!r} does not match the required form {pattern}; did you mean {guess}?"
        example = PATTERN_EXAMPLES.get(pattern)
        return f"{value!r} does not match the required form {pattern}" + (f"; use {example}" if example else "")
    msg = str(error["msg"])
    msg = re.sub(r"^Value error, ", "", msg)
    key = loc[-1] if loc and isinstance(loc[-1], str) else None
    if isinstance(value, bool) and kind in ("int_type", "float_type"):
        return f"{msg}, got {value} (YAML reads yes/no/on/off/true/false as booleans); write a number"
    if isinstance(value, bool) and kind == "string_type":
        word = "yes" if value else "no"
        quoted = f"{key}: '{word}'" if key else f"'{word}'"
        return (
            f"{msg}, got {str(value).lower()} (YAML reads unquoted yes/no/on/off/true/false as booleans); quote the "
            f"text, e.g. {quoted}"
        )
    if kind == "string_type" and isinstance(value, (int, float, datetime.date)):
        quoted = f"{key}: '{value}'" if key else f"'{value}'"
        what = "a date" if isinstance(value, datetime.date) else "a number"
        return f"{msg}, got {value} (YAML reads it as {what}); quote it: {quoted}"
    if kind in ("int_type", "float_type") and isinstance(value, str):
        number = _number_hint(value)
        if number:
            return f"{msg}, {number}"
    if kind == "int_type" and isinstance(value, float):
        whole = f"it without the decimal point: {int(value)}" if value.is_integer() else "a whole number"
        return f"{msg}, got {value}; write {whole}"
    if kind == "float_type" and isinstance(value, int):
        return f"{msg}, got {_show(value)}, too large to be one; write a smaller number"
    if kind == "bool_type" and isinstance(value, str):
        return f"{msg}, got {value!r} (text, in quotes); write true or false without quotes"
    if value is None and kind.endswith("_type"):
        model = _model_at(loc)
        field = model.model_fields.get(str(key)) if model and key else None
        default = field is not None and not field.is_required()
        fix = "remove the line to take the default, or give a value" if default else "give a value"
        return f"{msg}, got nothing (null, or a key with no value); {fix}"
    if kind == "too_short":
        return f"{msg} (got {_show(value)}); add at least {error['ctx']['min_length']}"
    if kind == "too_long" and key == "instance_types":  # the one list with a service's limit
        return f"{msg}: an Auto Scaling group takes at most {error['ctx']['max_length']}; remove the rest"
    if kind == "list_type":
        what = "a list of clusters" if key == "clusters" else "a list"
        got = "a mapping" if isinstance(value, dict) else _show(value)
        return f"expected {what} (each item starts with '- ', or write [a, b]), got {got}"
    if kind == "model_type":
        model = _model_at((*loc, ""))
        keys = ", ".join(f"{k}:" for k in list(model.model_fields)[:3]) if model else ""
        got = "a list" if isinstance(value, list) else _show(value)
        where = f"indented under {key}:" if key else "in this list item"
        return f"expected keys ({keys} ...) {where}, got {got}"
    return f"{msg} (got {_show(value)})" if kind not in ("value_error",) and not isinstance(value, dict) else msg


def _guesses(error: Any) -> list[str]:
    """The allowed keys an unknown key (``extra_forbidden``) may be a typo of."""
    loc = tuple(error["loc"])
    model = _model_at(loc)
    return _similar_keys(str(loc[-1]), sorted(model.model_fields) if model else [])


def _one_per_typo(errors: list[Any]) -> list[Any]:
    """A misspelt required key (``max_node:``) is one problem: the unknown key, with its suggestion; not also the
    required key it was meant to be, as missing."""
    meant = {(*tuple(e["loc"])[:-1], guess) for e in errors if e["type"] == "extra_forbidden" for guess in _guesses(e)}
    return [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in meant)]


def _line(error: Any) -> str:
    """One problem: field, what is wrong, the fix."""
    field = _loc(tuple(error["loc"]))
    if error["type"] == "empty_section":
        return f"{field} is empty: {error['msg']}"
    return f"{field + ': ' if field else ''}{_describe(error)}"


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


def load_team(path: Path) -> Team:
    name = path.stem
    if not re.match(NAME_PATTERN, name):
        raise ConfigError(
            f"{path}: team name '{name}' (from the file name) is not DNS-safe; rename the file to "
            "lowercase letters, digits and '-', starting with a letter, at most 32 characters"
        )
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
        raise ConfigError(
            f"{path}: the file is empty; write the team's settings (at least clusters:), as in teams/default.yaml"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys (clusters:, network:, ...), got {type(raw).__name__}")
    try:
        config = TeamConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{path}: {_line(error)}" for error in _one_per_typo(exc.errors()))) from None
    stale = stale_snapshot_ids(text, path)
    if stale:
        raise ConfigError("\n".join(f"{path}: {line}" for line in stale))
    return Team(name=name, path=path, config=config)


def load_teams(teams_dir: Path, only: Optional[str] = None) -> list[Team]:
    """Every ``*.yaml``/``*.yml`` in ``teams_dir`` (or just team ``only``), default team first. Dotfiles are not
    team files: an editor's lock or backup (Emacs's ``.#default.yaml``) is skipped."""
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
