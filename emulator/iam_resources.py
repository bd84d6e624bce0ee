"""Tell moto's IAM evaluation which resource a request touches, for the actions our instance role is scoped on.

moto (5.2.x) evaluates identity policies only when its IAM enforcement is on (``/moto-api/reset-auth``), and then
checks S3 requests against the bucket/object ARN but every other service's request against Resource ``"*"``
(``BaseResponse.call_action`` asks the response class for ``_determine_resource``; only SQS, IAM and STS have one).
A policy that names a log group, an Auto Scaling group, a volume, a parameter or a secret by ARN therefore never
matches, and a policy on ``"*"`` always does: the resource part of those policies is not tested at all.

:func:`install` gives moto's Logs, Auto Scaling, EC2, SSM and Secrets Manager response classes a
``_determine_resource`` for the few actions below, with the ARN AWS authorizes them on (the service authorization
reference), so moto's own evaluator compares it with the policy's ``Resource``. Every other action keeps ``"*"``, as in
moto. What this does not add (see tests/emulator/test_isolation.py): condition keys (moto ignores ``StringLike``, and
``StringEquals`` on keys it gets no value for, such as ``aws:ResourceTag/...`` and ``s3:prefix``), the second resource
of a two-resource action (``AttachVolume`` is checked on the volume, not the instance), and the log stream of
``PutLogEvents`` (moto's ``Fn::GetAtt LogGroup.Arn`` lacks AWS's trailing ``:*``, so both logs actions are checked
against the group's ARN as moto reports it), and ``ssm:GetParameters`` (several parameters in one request: checked
against ``"*"``, so a role scoped by ARN is denied it here; use ``GetParameter``).

:func:`install` also logs every request moto's enforcement refuses (denied, or credentials it does not know) to the
server log, one line each with the action, the resource it was checked on and the access key id (``WARNING
emulator.iam: refused s3:PutObject on arn:aws:s3:::bucket/key for ASIA...: AccessDenied``), because a caller may
swallow the error (the node agent tolerates a failed log upload, for one): :func:`refusals` reads them back.

Installed by ``python -m emulator.server --iam-enforcement`` only; enforcement itself stays off until
:meth:`emulator.cloud.EmulatedCloud.enforce_iam` switches it on, so the deploys before that run unauthenticated.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moto.utilities.utils import get_partition

from emulator.moto_patch import original, patch

REFUSALS = logging.getLogger("emulator.iam")
_REFUSED = re.compile(r"^WARNING emulator\.iam: refused (\S+) on (\S+) for (\S+): (\S+)$", re.MULTILINE)

LOG_GROUP_ACTIONS = frozenset({"CreateLogStream", "PutLogEvents"})
GROUP_ACTIONS = frozenset(
    {"SetDesiredCapacity", "UpdateAutoScalingGroup", "CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"}
)
INSTANCE_IN_GROUP_ACTIONS = frozenset({"TerminateInstanceInAutoScalingGroup", "SetInstanceProtection"})
VOLUME_ACTIONS = frozenset({"AttachVolume", "DetachVolume"})
PARAMETER_ACTIONS = frozenset({"GetParameter", "PutParameter"})
SECRET_ACTIONS = frozenset({"GetSecretValue", "DescribeSecret"})


def _logs_resource(self: Any) -> str:
    if self._get_action() in LOG_GROUP_ACTIONS:
        name = self._get_param("logGroupName")
        if name:
            return f"arn:{get_partition(self.region)}:logs:{self.region}:{self.current_account}:log-group:{name}"
    return "*"


def _autoscaling_resource(self: Any) -> str:
    action = self._get_action()
    backend = self.autoscaling_backend
    if action in GROUP_ACTIONS:
        group = backend.autoscaling_groups.get(self._get_param("AutoScalingGroupName"))
        return str(group.arn) if group is not None else "*"
    if action in INSTANCE_IN_GROUP_ACTIONS:
        instance_id = self._get_param("InstanceId")
        for group in backend.autoscaling_groups.values():
            if any(state.instance.id == instance_id for state in group.instance_states):
                return str(group.arn)
    return "*"


def _ec2_resource(self: Any) -> str:
    if self._get_action() in VOLUME_ACTIONS:
        volume_id = self._get_param("VolumeId")
        if volume_id:
            return f"arn:{get_partition(self.region)}:ec2:{self.region}:{self.current_account}:volume/{volume_id}"
    return "*"


def _ssm_resource(self: Any) -> str:
    if self._get_action() in PARAMETER_ACTIONS:
        name = str(self._get_param("Name") or "")
        if name:
            partition = get_partition(self.region)
            return f"arn:{partition}:ssm:{self.region}:{self.current_account}:parameter/{name.lstrip('/')}"
    return "*"


def _secretsmanager_resource(self: Any) -> str:
    """The secret's ARN (with the random suffix Secrets Manager gives it) for a secret that exists; the ARN of its
    name otherwise (the call then fails as AWS's would: denied, or not found)."""
    if self._get_action() in SECRET_ACTIONS:
        secret_id = str(self._get_param("SecretId") or "")
        secret = self.backend.secrets.get(secret_id) if secret_id else None
        if secret is not None:
            return str(secret.arn)
        if secret_id:
            partition = get_partition(self.region)
            return f"arn:{partition}:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"
    return "*"


def _safe(resolver: Any) -> Any:
    """A resolver that cannot break a request: anything unexpected falls back to moto's own ``"*"``."""

    def determine(self: Any) -> str:
        try:
            return str(resolver(self))
        except Exception:  # fall back to moto's behaviour: never fail the request here
            return "*"

    determine.emulator_iam_resources = True  # type: ignore[attr-defined]
    return determine


@dataclass(frozen=True)
class Refusal:
    """A request moto's IAM enforcement refused, as logged by the server."""

    action: str  # service:Action, as moto evaluated it
    resource: str
    access_key_id: str
    error: str  # moto's exception class, e.g. AccessDeniedError, S3AccessDeniedError, InvalidClientTokenIdError


def refusals(server_log: Path, offset: int = 0) -> list[Refusal]:
    """The refused requests logged in ``server_log`` since byte ``offset``, in order."""
    if not server_log.exists():
        return []
    with open(server_log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [Refusal(*m.groups()) for m in _REFUSED.finditer(text)]


def _between(text: str, start: str, end: str) -> str:
    begin = text.find(start)
    if begin < 0:
        return ""
    begin += len(start)
    stop = text.find(end, begin)
    return text[begin:] if stop < 0 else text[begin:stop]


def _log_refusals() -> None:
    """Wrap moto's check of every request (``ActionAuthenticatorMixin._authenticate_and_authorize_action``, the
    one place S3 and every other service go through) to log what it refuses; the refusal itself is unchanged."""
    from moto.core.authorization import ActionAuthenticatorMixin

    checked = "_authenticate_and_authorize_action"

    def authenticate_and_authorize(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        try:
            original(ActionAuthenticatorMixin, checked)(self, iam_request_cls, resource)
        except Exception as exc:
            scope = _between(str(self.headers.get("Authorization", "")), "Credential=", ",").split("/")
            key, service = (scope[0], scope[3]) if len(scope) > 3 else ("?", "?")
            try:
                found = self._get_action()
                action = str(found[0] if isinstance(found, list) else found)
            except Exception:  # the log line must not change the answer
                action = "?"
            REFUSALS.warning("refused %s:%s on %s for %s: %s", service, action, resource, key, type(exc).__name__)
            raise

    patch(ActionAuthenticatorMixin, checked, authenticate_and_authorize)


def install() -> None:
    """Add the resolvers to moto's response classes and log refusals (idempotent). Run before the server handles
    requests."""
    _log_refusals()
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.ec2.responses import EC2Response
    from moto.logs.responses import LogsResponse
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.ssm.responses import SimpleSystemManagerResponse

    for cls, resolver in (
        (LogsResponse, _logs_resource),
        (AutoScalingResponse, _autoscaling_resource),
        (EC2Response, _ec2_resource),
        (SimpleSystemManagerResponse, _ssm_resource),
        (SecretsManagerResponse, _secretsmanager_resource),
    ):
        current = vars(cls).get("_determine_resource")
        if current is not None and not getattr(current, "emulator_iam_resources", False):
            raise RuntimeError(f"moto's {cls.__name__} now determines resources itself: revisit emulator/iam_resources")
        patch(cls, "_determine_resource", _safe(resolver))
