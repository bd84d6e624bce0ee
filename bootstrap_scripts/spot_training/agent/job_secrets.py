"""The job's secrets: their values read from SSM Parameter Store or Secrets Manager right before each trainer starts,
for the trainer's environment only.

A value lives in the agent's memory and in the environment it passes to torchrun, nothing else: it is never logged,
written to a file, a marker, the node's state or S3 (the agent's log lines name a secret, never its value). A read
that fails (no such secret, access denied, not a string) raises ``AgentError`` naming the variable and the secret,
with the service's error code: the job ends FAILED."""

from __future__ import annotations

from typing import Any, Dict

from botocore.exceptions import ClientError

from spot_training.agent.errors import AWS_ERRORS, AgentError


def read_secret(ssm: Any, secretsmanager: Any, source: str) -> str:
    """The value of ``ssm:<parameter>`` (decrypted) or ``secretsmanager:<secret>`` (its string)."""
    kind, _, name = source.partition(":")
    if kind == "ssm":
        return str(ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
    value = secretsmanager.get_secret_value(SecretId=name).get("SecretString")
    if not isinstance(value, str):
        raise ValueError("a binary secret; only string secrets can go in an environment variable")
    return value


def read_secrets(ssm: Any, secretsmanager: Any, secrets: Dict[str, str]) -> Dict[str, str]:
    """``{NAME: value}`` of the job's ``secrets`` (``{NAME: source}``)."""
    values: Dict[str, str] = {}
    for name, source in sorted(secrets.items()):
        try:
            values[name] = read_secret(ssm, secretsmanager, source)
        except (*AWS_ERRORS, ValueError, KeyError) as exc:
            raise AgentError(f"secret {name} ({source}) cannot be read: {why(exc)}") from None
    return values


def why(exc: Exception) -> str:
    """The error's code (AccessDeniedException, ParameterNotFound, ...), never its message: a service's message
    could quote what it was given."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "refused")
    if isinstance(exc, ValueError):
        return str(exc)
    return type(exc).__name__


def job_environment(ssm: Any, secretsmanager: Any, spec: Dict[str, Any]) -> Dict[str, str]:
    """What the job adds to its trainer's environment: its ``env``, and its secrets' values read now."""
    return {**(spec.get("env") or {}), **read_secrets(ssm, secretsmanager, spec.get("secrets") or {})}
