"""ST6: the checkpoint bucket (versioned, encrypted, private, TLS-only, aborting incomplete uploads)."""

from __future__ import annotations

import json
from typing import Any, Optional

from compliance.spot_training.arns import render
from compliance.spot_training.template import Resource, Template, as_list, mentions, props, resources_of, tags, truthy

CHECKPOINT_ROLE_TAG = ("spot-training:role", "checkpoints")  # marks the checkpoint bucket


def _is_checkpoint_bucket(resource: Resource) -> bool:
    key, value = CHECKPOINT_ROLE_TAG
    return tags(resource).get(key) == value


def check_checkpoint_bucket(logical_id: str, resource: Resource, template: Template) -> Optional[list[str]]:
    if not _is_checkpoint_bucket(resource):
        return None
    p = props(resource)
    problems = []
    if p.get("VersioningConfiguration", {}).get("Status") != "Enabled":
        problems.append("not versioned")
    if not p.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration"):
        problems.append("not encrypted")
    block = p.get("PublicAccessBlockConfiguration", {})
    flags = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
    if not all(truthy(block.get(k)) for k in flags):
        problems.append("public access not fully blocked")
    rules = p.get("LifecycleConfiguration", {}).get("Rules", [])
    if not any(r.get("AbortIncompleteMultipartUpload") and r.get("Status", "Enabled") == "Enabled"
               and not r.get("Prefix") and not r.get("TagFilters") for r in rules):  # fmt: skip
        problems.append("no lifecycle rule aborting incomplete multipart uploads in the whole bucket")
    statements = [
        st
        for policy in resources_of(template, "AWS::S3::BucketPolicy").values()
        if mentions(props(policy).get("Bucket"), logical_id)
        for st in as_list(props(policy).get("PolicyDocument", {}).get("Statement", []))
    ]
    if not any(_denies_plain_http(st) for st in statements):
        problems.append("no bucket policy denying aws:SecureTransport=false to everyone, for every action on the "
                        "bucket and its objects")  # fmt: skip
    return problems


def _denies_plain_http(statement: dict[str, Any]) -> bool:
    """A Deny of every S3 action (``s3:*``) to every principal on the bucket and its objects (``<bucket>/*``) when
    ``aws:SecureTransport`` is false: one limited to an action, a principal or the bucket alone does not make it
    TLS-only."""
    condition = json.dumps(statement.get("Condition", {}))
    principal = statement.get("Principal")
    resources = [render(r) for r in as_list(statement.get("Resource", []))]
    return (
        statement.get("Effect") == "Deny"
        and "aws:SecureTransport" in condition
        and "false" in condition
        and principal in ("*", {"AWS": "*"})
        and any(a in ("s3:*", "*") for a in as_list(statement.get("Action", [])))
        and any(r.endswith("/*") for r in resources)
        and any(not r.endswith("/*") for r in resources)
    )
