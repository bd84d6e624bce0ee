"""Resource ARNs as text, and which of them name every resource of a kind."""

from __future__ import annotations

import re
from typing import Any

# An ARN that names every resource of its kind: arn:aws:ssm:us-east-1:123456789012:* , arn:aws:s3:::*/* ...
WILDCARD_ARN = re.compile(r"arn:[^:]*:[^:]*:[^:]*:[^:]*:\*(/\*)?|arn:[^:]*:s3:::\*(/\*)?")
# An ARN that names every resource of one type in the account (parameter/*, volume/vol-*, secret:*, every Auto
# Scaling group: IAM's * also matches : and /). Fine under a resource tag condition (the warm pool's claim and the
# drill: instance/* of the cluster's own tags). S3 ARNs have no type.
TYPE_WILDCARD_ARN = re.compile(
    r"arn:[^:]*:(?!s3:)[^:]*:[^:]*:[^:]*:(autoScalingGroup:\*(:autoScalingGroupName/\*)?|[A-Za-z-]+[/:]?[\w.-]*\*)"
)
SUB_VARIABLE = re.compile(r"\$\{(!?)([^}]*)\}")


def render(value: Any) -> str:
    """An ARN as text, every intrinsic (Ref, GetAtt, a ``Fn::Sub`` variable, ...) as ``<ref>``; only a literal
    ``*`` stays a wildcard."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return str(separator).join(render(p) for p in parts)
    if isinstance(value, dict) and set(value) == {"Fn::Sub"}:
        text, variables = value["Fn::Sub"] if isinstance(value["Fn::Sub"], list) else (value["Fn::Sub"], {})
        # ${!Literal} is the text ${Literal}; a variable of the map is its value; any other ${...} is known at deploy
        return SUB_VARIABLE.sub(
            lambda m: "${" + m[2] + "}" if m[1] else render(variables[m[2]]) if m[2] in variables else "<ref>",
            str(text),
        )
    return "<ref>"


def scoped_by_tag(statement: dict[str, Any]) -> bool:
    """Whether the statement's Condition limits it to resources carrying a tag (``aws:ResourceTag/...``,
    ``ec2:ResourceTag/...``): an account-wide ARN pattern then reaches only the tagged ones."""
    condition = statement.get("Condition")
    keys = [key for block in condition.values() if isinstance(block, dict) for key in block] if condition else []
    return any("resourcetag/" in str(key).lower() for key in keys)


def is_wildcard_resource(resource: Any, tag_scoped: bool = False) -> bool:
    """``*``, or an ARN (written out, joined or substituted) that names every resource of a service's kind, or
    (unless ``tag_scoped``: a resource tag condition) every resource of one type."""
    text = render(resource)
    if not tag_scoped and TYPE_WILDCARD_ARN.fullmatch(text):
        return True
    return text == "*" or WILDCARD_ARN.fullmatch(text) is not None
