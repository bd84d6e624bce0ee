"""S3 (items 2, 6 and 9 of :mod:`emulator.cfn_compat`): bucket policies, their evaluation on requests, and buckets
with everything the template says.

2. ``AWS::S3::BucketPolicy``: no CloudFormation type. -> A model that stores ``PolicyDocument`` as
   the bucket's policy through moto's S3 backend (``get_bucket_policy`` returns it) and deletes it
   with the stack. Used by the TLS-only/deny policies of our buckets and by the CDK bootstrap stack.
6. Bucket policies on requests: moto checks a bucket's policy on object requests but evaluates only
   ``StringEquals`` conditions, counts every other condition as met, and answers DENIED for *any*
   statement whose condition fails (even an Allow). Our buckets (and the CDK's) carry "Deny if
   ``aws:SecureTransport`` is false", which moto therefore applies to every request, including TLS
   ones. -> ``FakeBucket.get_permission`` is replaced by an evaluator with AWS's semantics for the
   statements moto considers (principal ``*``): Deny wins, then Allow, else neutral; a condition on
   a key the request does not carry does not match; operators ``Bool``, ``String(Not)Equals``,
   ``String(Not)Like``, ``ArnLike``/``ArnEquals``, ``Null`` (and ``...IfExists``). The request context
   carries ``aws:SecureTransport`` from the listener the request really arrived on (the server's
   HTTPS listener: true, its plain-HTTP listener: false), so plain HTTP is denied as on AWS.
9. ``AWS::S3::Bucket``: moto's model applies only ``BucketEncryption`` and ``Tags``; it drops
   ``VersioningConfiguration``, ``LifecycleConfiguration``, ``PublicAccessBlockConfiguration``,
   ``OwnershipControls`` and ``LoggingConfiguration``. -> A model that applies each through moto's S3
   backend (what ``PutBucketVersioning`` etc. would store), readable with ``get_bucket_*``. Logging:
   moto refuses a target bucket whose log-delivery policy does not exist yet; CloudFormation creates
   the target's ``BucketPolicy`` in parallel with the source bucket (no dependency between them),
   so the configuration is stored after checking only that the target bucket exists in the region.
   ``AccessControl`` (the CDK bootstrap bucket's ``Private``) becomes the bucket's canned ACL.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import json
import logging
import re
from collections.abc import Iterator
from typing import Any, Optional

from moto.core.common_models import CloudFormationModel
from moto.s3.models import FakeBucket, s3_backends
from moto.utilities.utils import get_partition

from emulator.cfn_compat.base import UNSUPPORTED_PROPERTY, CompatModel, as_bool
from emulator.moto_patch import patch

logger = logging.getLogger(__name__)


# --- 2. Bucket policies --------------------------------------------------------------------------


class BucketPolicy(CompatModel, CloudFormationModel):
    """``AWS::S3::BucketPolicy``: the document becomes the bucket's policy in moto's S3 backend; ``Ref`` = the
    bucket's name."""

    CFN_TYPE = "AWS::S3::BucketPolicy"

    def __init__(self, account_id: str, region_name: str, bucket_name: str, document: dict[str, Any]) -> None:
        self.account_id = account_id
        self.region_name = region_name
        self.name = bucket_name
        self.document = document

    @staticmethod
    def _backend(account_id: str, region_name: str) -> Any:
        return s3_backends[account_id][get_partition(region_name)]

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> BucketPolicy:
        bucket_name = props["Bucket"]
        document = props["PolicyDocument"]
        if isinstance(document, str):
            document = json.loads(document)
        cls._backend(account_id, region_name).put_bucket_policy(bucket_name, json.dumps(document).encode())
        return cls(account_id, region_name, bucket_name, document)

    @classmethod
    def update(
        cls, original: BucketPolicy, new_name: str, props: dict[str, Any], account_id: str, region_name: str
    ) -> BucketPolicy:
        if props["Bucket"] != original.name:
            original.delete(account_id, region_name)
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        cls._backend(account_id, region_name).delete_bucket_policy(props.get("Bucket", name))

    def delete(self, account_id: str, region_name: str) -> None:
        from moto.s3.exceptions import MissingBucket

        try:
            self._backend(account_id, region_name).delete_bucket_policy(self.name)
        except MissingBucket:
            pass  # the bucket went first: its policy went with it


# --- 9. S3 buckets with everything the template says -----------------------------------------------

_BUCKET_PROPS = frozenset({
    "BucketName", "BucketEncryption", "Tags", "VersioningConfiguration", "LifecycleConfiguration",
    "PublicAccessBlockConfiguration", "OwnershipControls", "LoggingConfiguration", "AccessControl",
})  # fmt: skip


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """A CloudFormation lifecycle rule in the shape moto's ``PutBucketLifecycleConfiguration`` parser makes."""
    out: dict[str, Any] = {"ID": rule.get("Id"), "Status": rule.get("Status", "Enabled")}
    out["Filter"] = {"Prefix": rule.get("Prefix", "")}
    expiration: dict[str, Any] = {}
    if rule.get("ExpirationInDays") is not None:
        expiration["Days"] = int(rule["ExpirationInDays"])
    if rule.get("ExpirationDate") is not None:
        expiration["Date"] = rule["ExpirationDate"]
    if rule.get("ExpiredObjectDeleteMarker") is not None:
        expiration["ExpiredObjectDeleteMarker"] = str(rule["ExpiredObjectDeleteMarker"]).lower()
    if expiration:
        out["Expiration"] = expiration
    if rule.get("AbortIncompleteMultipartUpload"):
        out["AbortIncompleteMultipartUpload"] = {
            "DaysAfterInitiation": int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
        }
    nve = rule.get("NoncurrentVersionExpiration")
    if nve or rule.get("NoncurrentVersionExpirationInDays") is not None:
        days = (nve or {}).get("NoncurrentDays", rule.get("NoncurrentVersionExpirationInDays"))
        out["NoncurrentVersionExpiration"] = {"NoncurrentDays": int(str(days))}
        if nve and nve.get("NewerNoncurrentVersions") is not None:
            out["NoncurrentVersionExpiration"]["NewerNoncurrentVersions"] = int(nve["NewerNoncurrentVersions"])
    transitions = list(rule.get("Transitions", [])) + ([rule["Transition"]] if rule.get("Transition") else [])
    if transitions:
        out["Transition"] = [
            {"Days": t.get("TransitionInDays"), "Date": t.get("TransitionDate"), "StorageClass": t["StorageClass"]}
            for t in transitions
        ]
    nvts = list(rule.get("NoncurrentVersionTransitions", []))
    if rule.get("NoncurrentVersionTransition"):
        nvts.append(rule["NoncurrentVersionTransition"])
    if nvts:
        out["NoncurrentVersionTransition"] = [
            {"NoncurrentDays": t.get("TransitionInDays"), "StorageClass": t["StorageClass"]} for t in nvts
        ]
    unknown = set(rule) - {
        "Id", "Status", "Prefix", "ExpirationInDays", "ExpirationDate", "ExpiredObjectDeleteMarker",
        "AbortIncompleteMultipartUpload", "NoncurrentVersionExpiration", "NoncurrentVersionExpirationInDays",
        "Transitions", "Transition", "NoncurrentVersionTransitions", "NoncurrentVersionTransition",
    }  # fmt: skip
    for key in sorted(unknown):
        logger.warning("%s AWS::S3::Bucket.LifecycleConfiguration.Rules.%s is not emulated", UNSUPPORTED_PROPERTY, key)
    return out


def _apply_bucket_properties(backend: Any, bucket: Any, props: dict[str, Any]) -> None:
    from moto.s3.models import get_canned_acl

    name = bucket.name
    if props.get("AccessControl"):
        # CloudFormation spells canned ACLs in PascalCase: LogDeliveryWrite -> log-delivery-write.
        backend.put_bucket_acl(name, get_canned_acl(re.sub(r"(?<!^)(?=[A-Z])", "-", props["AccessControl"]).lower()))
    versioning = props.get("VersioningConfiguration")
    if versioning:
        backend.put_bucket_versioning(name, versioning["Status"])
    lifecycle = props.get("LifecycleConfiguration")
    if lifecycle:
        backend.put_bucket_lifecycle(name, [_lifecycle_rule(r) for r in lifecycle.get("Rules", [])])
    pab = props.get("PublicAccessBlockConfiguration")
    if pab:
        backend.put_public_access_block(
            name,
            {
                k: str(as_bool(pab.get(k, False))).lower()
                for k in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
            },
        )
    ownership = props.get("OwnershipControls")
    if ownership:
        backend.put_bucket_ownership_controls(name, ownership["Rules"][0]["ObjectOwnership"])
    logging_cfg = props.get("LoggingConfiguration")
    if logging_cfg:
        config = {"TargetBucket": logging_cfg.get("DestinationBucketName", name)}
        config["TargetPrefix"] = logging_cfg.get("LogFilePrefix", "")
        target = backend.get_bucket(config["TargetBucket"])  # raises NoSuchBucket, as AWS would
        if target.region_name != bucket.region_name:
            from moto.s3.exceptions import CrossLocationLoggingProhibited

            raise CrossLocationLoggingProhibited()
        bucket.logging = config


class Bucket(CompatModel, CloudFormationModel):
    """``AWS::S3::Bucket`` with versioning, lifecycle, public access block, ownership, logging (moto's bucket)."""

    CFN_TYPE = "AWS::S3::Bucket"
    NAME_PROPERTY = "BucketName"
    MOTO_MODEL = FakeBucket
    PROPERTIES = _BUCKET_PROPS

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        bucket = FakeBucket.create_from_cloudformation_json(name, {"Properties": props}, account_id, region_name)
        _apply_bucket_properties(s3_backends[account_id][get_partition(region_name)], bucket, props)
        return bucket

    @classmethod
    def update(cls, original: Any, new_name: str, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        bucket = FakeBucket.update_from_cloudformation_json(
            original, new_name, {"Properties": props}, account_id, region_name
        )
        _apply_bucket_properties(s3_backends[account_id][get_partition(region_name)], bucket, props)
        return bucket


# --- 6. Bucket policies evaluated with the request's transport -------------------------------------

_REQUEST_CONTEXT: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar(
    "emulator_request_context", default=None
)


@contextlib.contextmanager
def request_transport(*, secure: bool) -> Iterator[None]:
    """Set the policy context keys of the request being handled (the server wraps every request)."""
    token = _REQUEST_CONTEXT.set({"aws:securetransport": "true" if secure else "false"})
    try:
        yield
    finally:
        _REQUEST_CONTEXT.reset(token)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _wildcard(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _condition_matches(operator: str, key: str, expected: Any, context: dict[str, str]) -> bool:
    actual = context.get(key.lower())
    if operator == "Null":
        return (actual is None) == (str(_as_list(expected)[0]).lower() == "true")
    if_exists = operator.endswith("IfExists")
    op = operator[: -len("IfExists")] if if_exists else operator
    if actual is None:
        return if_exists  # AWS: a key the request does not carry makes the condition false
    values = [str(v) for v in _as_list(expected)]
    if op == "Bool":
        return actual.lower() in [v.lower() for v in values]
    if op == "StringEquals" or op == "ArnEquals":
        return actual in values
    if op == "StringNotEquals" or op == "ArnNotEquals":
        return actual not in values
    if op == "StringEqualsIgnoreCase":
        return actual.lower() in [v.lower() for v in values]
    if op in ("StringLike", "ArnLike"):
        return any(_wildcard(v, actual) for v in values)
    if op in ("StringNotLike", "ArnNotLike"):
        return not any(_wildcard(v, actual) for v in values)
    logger.warning("bucket policy condition operator %s is not emulated: treated as not matching", operator)
    return False


def _statement_applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    principal = statement.get("Principal")
    if not (principal == "*" or (isinstance(principal, dict) and principal.get("AWS") == "*")):
        return False  # as moto: only statements for everyone are checked (callers are not identified)
    if "Action" in statement:
        if not any(_wildcard(a.lower(), action.lower()) for a in _as_list(statement["Action"])):
            return False
    elif any(_wildcard(a.lower(), action.lower()) for a in _as_list(statement.get("NotAction", []))):
        return False
    if "Resource" in statement:
        if not any(_wildcard(r, resource) for r in _as_list(statement["Resource"])):
            return False
    elif any(_wildcard(r, resource) for r in _as_list(statement.get("NotResource", []))):
        return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, expected in keys.items():
            if not _condition_matches(operator, key, expected, context):
                return False
    return True


def evaluate_bucket_policy(policy: str, action: str, resource: str, context: dict[str, str]) -> Any:
    """AWS's order for one resource policy: an applicable Deny wins, then an Allow, else no opinion."""
    from moto.iam.access_control import PermissionResult

    statements = _as_list(json.loads(policy).get("Statement", []))
    applicable = [s for s in statements if _statement_applies(s, action, resource, context)]
    if any(s.get("Effect") == "Deny" for s in applicable):
        return PermissionResult.DENIED
    if any(s.get("Effect") == "Allow" for s in applicable):
        return PermissionResult.PERMITTED
    return PermissionResult.NEUTRAL


def _bucket_get_permission(self: Any, action: str, resource: str) -> Any:
    from moto.iam.access_control import PermissionResult

    if self.policy is None:
        return PermissionResult.NEUTRAL
    policy = self.policy.decode() if isinstance(self.policy, bytes) else self.policy
    return evaluate_bucket_policy(policy, action, resource, _REQUEST_CONTEXT.get() or {})


def patch_moto() -> None:
    """Bucket policies evaluated with AWS's semantics and the request's transport (item 6)."""
    patch(FakeBucket, "get_permission", _bucket_get_permission)
