"""Skipping a checkov check: on the narrowest CloudFormation resource, exact check id, checkable reason.

checkov reads ``Metadata: checkov: skip: [{id, comment}]`` on a resource of a CloudFormation template and reports
the check as skipped with that comment. :mod:`review_gates.checkov_scan` runs checkov on the templates
(``make review``, ``tests/test_security_gates.py``, which fails on any failed check and on any skip without a reason).
"""

from __future__ import annotations

from typing import Any, Union

from aws_cdk import CfnResource
from constructs import IConstruct


def skip_checkov(scope: Union[IConstruct, CfnResource], check_id: str, reason: str) -> None:
    """Skip ``check_id`` (e.g. ``CKV_AWS_158``) on ``scope``'s CloudFormation resource; keeps earlier skips."""
    resource = scope if isinstance(scope, CfnResource) else scope.node.default_child
    if not isinstance(resource, CfnResource):
        raise TypeError(f"skip_checkov: {scope.node.path} has no CloudFormation resource to put the skip on")
    if len(reason.strip()) < 20:
        raise ValueError(f"skip_checkov: give {check_id} a reason a reviewer can check, not {reason!r}")
    current: Any = resource.get_metadata("checkov") or {}
    skips = [s for s in current.get("skip", []) if s["id"] != check_id]
    resource.add_metadata("checkov", {**current, "skip": [*skips, {"id": check_id, "comment": reason}]})
