"""ST10: security group ingress from the internet (an open CIDR, or a parameter that can be one)."""

from __future__ import annotations

import re
from typing import Any, Optional

from compliance.spot_training.template import Resource, Template, mentions, props

OPEN_CIDR = {"CidrIp": "0.0.0.0/0", "CidrIpv6": "::/0"}


def _can_be(parameter: dict[str, Any], value: str) -> bool:
    """Whether a deployer can give the template parameter ``value`` (its AllowedValues, else its AllowedPattern)."""
    if "AllowedValues" in parameter:
        return value in parameter["AllowedValues"]
    try:
        return re.fullmatch(str(parameter.get("AllowedPattern", ".*")), value) is not None
    except re.error:  # a Java pattern Python cannot read: assume it lets the value through
        return True


def _open_ingress(rule: dict[str, Any], template: Template) -> Optional[str]:
    """What opens the rule to the internet: an open CIDR, or template parameters it uses that can be one at
    deploy (through Ref, Fn::Select, Fn::Sub ...)."""
    for key, open_cidr in OPEN_CIDR.items():
        cidr = rule.get(key)
        if cidr == open_cidr:
            return open_cidr
        if isinstance(cidr, dict):
            parameters = template.get("Parameters", {})
            found = sorted(name for name, parameter in parameters.items()
                           if mentions(cidr, name) and _can_be(parameter, open_cidr))  # fmt: skip
            if found:
                return f"parameter {', '.join(found)} (can be {open_cidr} at deploy)"
    return None


def check_security_group_ingress(_: str, resource: Resource, template: Template) -> list[str]:
    p = props(resource)
    rules = p.get("SecurityGroupIngress", []) if resource.get("Type") == "AWS::EC2::SecurityGroup" else [p]
    return [f"ingress from {found}" for found in (_open_ingress(r, template) for r in rules) if found]
