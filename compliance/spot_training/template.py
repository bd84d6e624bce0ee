"""Reading a synthesized template: a resource's properties and tags, what a value refers to."""

from __future__ import annotations

import json
from typing import Any, Optional

Resource = dict[str, Any]
Template = dict[str, Any]


def props(resource: Resource) -> dict[str, Any]:
    return dict(resource.get("Properties") or {})


def tags(resource: Resource) -> dict[str, Any]:
    raw = props(resource).get("Tags") or []
    if isinstance(raw, dict):
        return dict(raw)
    return {str(t.get("Key")): t.get("Value") for t in raw if isinstance(t, dict)}


def ref_target(value: Any) -> Optional[str]:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` points at, else None."""
    if isinstance(value, dict):
        if "Ref" in value:
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            return str(target[0] if isinstance(target, list) else str(target).split(".")[0])
    return None


def mentions(value: Any, logical_id: str) -> bool:
    """Whether ``value`` refers to ``logical_id`` anywhere (Ref, GetAtt, Sub)."""
    return f'"{logical_id}"' in json.dumps(value) or "${" + logical_id in json.dumps(value)


def resources_of(template: Template, type_: str) -> dict[str, Resource]:
    return {k: v for k, v in template.get("Resources", {}).items() if v.get("Type") == type_}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def truthy(value: Any) -> bool:
    return value is True or value == "true"
