"""pydantic's validation errors of a team file (or of another YAML file read into a model: trainctl's job file) as
lines a person can act on: the field, what is wrong in the terms of the YAML that was written (a quoted number,
yes/no read as a boolean, a typo of a key), and the fix."""

from __future__ import annotations

import datetime
import decimal
import difflib
import math
import re
from collections.abc import Callable
from typing import Any, Optional

from pydantic import BaseModel

from team_config.instance_types import closest_instance_type
from team_config.model import INSTANCE_TYPE_PATTERN, PATTERN_EXAMPLES, TeamConfig


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


TEAM_FILE_REFERENCE = "docs/reference/team-file.md"


def _model_at(error: Any, loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    """The pydantic model that owns the last key of ``loc`` (to list allowed keys), from the file's model
    (``error["root"]``, set by :func:`error_lines`)."""
    model: Any = error["root"]
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
    """What is wrong and the fix, for one pydantic error (the field is named by the caller)."""
    loc, kind, value = tuple(error["loc"]), str(error["type"]), error["input"]
    early = EARLY.get(kind)
    if early is not None:
        return early(error)
    msg = re.sub(r"^Value error, ", "", str(error["msg"]))
    key = loc[-1] if loc and isinstance(loc[-1], str) else None
    if value is None and kind.endswith("_type"):
        return _nothing_given(error, msg, key)
    described = BY_KIND[kind](error, msg, key) if kind in BY_KIND else None
    if described is not None:
        return described
    return f"{msg} (got {_show(value)})" if kind not in ("value_error",) and not isinstance(value, dict) else msg


def _unknown_key(error: Any) -> str:
    loc = tuple(error["loc"])
    unknown = str(loc[-1])
    model = _model_at(error, loc)
    allowed = sorted(model.model_fields) if model else []
    guesses = _similar_keys(unknown, allowed)
    hint = f"did you mean {' or '.join(repr(g) for g in guesses)}? " if guesses else ""
    return f"unknown key '{unknown}': {hint}allowed keys here: {', '.join(allowed)}"


def _missing(error: Any) -> str:
    return f"required key is missing; add {error['loc'][-1]}: (see {error['reference']})"


def _pattern_mismatch(error: Any) -> str:
    value, pattern = error["input"], error["ctx"]["pattern"]
    if pattern == INSTANCE_TYPE_PATTERN:
        guess = closest_instance_type(str(value))
        if guess:
            return f"{value!r} does not match the required form {pattern}; did you mean {guess}?"
    example = PATTERN_EXAMPLES.get(pattern)
    return f"{value!r} does not match the required form {pattern}" + (f"; use {example}" if example else "")


# Errors described without pydantic's message: by their type.
EARLY: dict[str, Callable[[Any], str]] = {
    "extra_forbidden": _unknown_key,
    "missing": _missing,
    "string_pattern_mismatch": _pattern_mismatch,
}


def _nothing_given(error: Any, msg: str, key: Optional[str]) -> str:
    model = _model_at(error, tuple(error["loc"]))
    field = model.model_fields.get(str(key)) if model and key else None
    default = field is not None and not field.is_required()
    fix = "remove the line to take the default, or give a value" if default else "give a value"
    return f"{msg}, got nothing (null, or a key with no value); {fix}"


def _not_a_number(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    """``int_type``, ``float_type``: a boolean, a number in quotes or YAML's text, a fraction, one too large."""
    kind, value = error["type"], error["input"]
    if isinstance(value, bool):
        return f"{msg}, got {value} (YAML reads yes/no/on/off/true/false as booleans); write a number"
    if isinstance(value, str):
        number = _number_hint(value)
        return f"{msg}, {number}" if number else None
    if kind == "int_type" and isinstance(value, float):
        whole = f"it without the decimal point: {int(value)}" if value.is_integer() else "a whole number"
        return f"{msg}, got {value}; write {whole}"
    if kind == "float_type" and isinstance(value, int):
        return f"{msg}, got {_show(value)}, too large to be one; write a smaller number"
    return None


def _not_text(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    """``string_type``: a boolean, a number or a date YAML read from unquoted text."""
    value = error["input"]
    if isinstance(value, bool):
        word = "yes" if value else "no"
        quoted = f"{key}: '{word}'" if key else f"'{word}'"
        return (
            f"{msg}, got {str(value).lower()} (YAML reads unquoted yes/no/on/off/true/false as booleans); quote the "
            f"text, e.g. {quoted}"
        )
    if isinstance(value, (int, float, datetime.date)):
        quoted = f"{key}: '{value}'" if key else f"'{value}'"
        what = "a date" if isinstance(value, datetime.date) else "a number"
        return f"{msg}, got {value} (YAML reads it as {what}); quote it: {quoted}"
    return None


def _not_a_boolean(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    if isinstance(error["input"], str):
        return f"{msg}, got {error['input']!r} (text, in quotes); write true or false without quotes"
    return None


def _too_short(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    return f"{msg} (got {_show(error['input'])}); add at least {error['ctx']['min_length']}"


def _too_long(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    if key == "instance_types":  # the one list with a service's limit
        return f"{msg}: an Auto Scaling group takes at most {error['ctx']['max_length']}; remove the rest"
    if key == "data_buckets":  # the job spec, an SSM parameter, has room for so many
        return f"{msg}: the job spec has room for at most {error['ctx']['max_length']}; list fewer"
    return None


def _not_a_list(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    value = error["input"]
    what = "a list of clusters" if key == "clusters" else "a list"
    got = "a mapping" if isinstance(value, dict) else _show(value)
    return f"expected {what} (each item starts with '- ', or write [a, b]), got {got}"


def _not_a_mapping(error: Any, msg: str, key: Optional[str]) -> Optional[str]:
    value = error["input"]
    model = _model_at(error, (*tuple(error["loc"]), ""))
    keys = ", ".join(f"{k}:" for k in list(model.model_fields)[:3]) if model else ""
    got = "a list" if isinstance(value, list) else _show(value)
    where = f"indented under {key}:" if key else "in this list item"
    return f"expected keys ({keys} ...) {where}, got {got}"


# Errors described from pydantic's message and the value YAML read, by type; None: the general form.
BY_KIND: dict[str, Callable[[Any, str, Optional[str]], Optional[str]]] = {
    "int_type": _not_a_number,
    "float_type": _not_a_number,
    "string_type": _not_text,
    "bool_type": _not_a_boolean,
    "too_short": _too_short,
    "too_long": _too_long,
    "list_type": _not_a_list,
    "model_type": _not_a_mapping,
}


def _guesses(error: Any) -> list[str]:
    """The allowed keys an unknown key (``extra_forbidden``) may be a typo of."""
    loc = tuple(error["loc"])
    model = _model_at(error, loc)
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


def error_lines(
    errors: list[Any], root: type[BaseModel] = TeamConfig, reference: str = TEAM_FILE_REFERENCE
) -> list[str]:
    """pydantic's errors of a file read into ``root`` (the team file's model by default), one line per problem:
    field, what is wrong, the fix (a missing key points to ``reference``)."""
    found = [{**error, "root": root, "reference": reference} for error in errors]
    return [_line(error) for error in _one_per_typo(found)]
