"""What the agent's duties raise and catch: the AWS and metadata errors it rides out, and its own one-line reasons."""

from __future__ import annotations

import http.client
import os
from typing import Optional, Tuple

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

# What an AWS call can raise when the service or the network misbehaves (a garbled answer is not a BotoCoreError).
AWS_ERRORS = (ClientError, BotoCoreError, ResponseParserError, S3UploadFailedError)  # upload_file's wrapper too
# What a metadata read can raise: no answer (URLError is an OSError) or a malformed one (BadStatusLine,
# IncompleteRead), which http.client does not wrap, or one that is not UTF-8.
IMDS_ERRORS = (OSError, http.client.HTTPException, UnicodeDecodeError)


class LeavingBeforeTraining(Exception):
    """A spot notice (or the agent's own SIGTERM) before this attempt's trainer started, or no place for this node
    within the join timeout while its peers have enough: leave, do not join."""


class StopBeforeTraining(LeavingBeforeTraining):
    """The job was asked to stop (``STOP``: trainctl stop, the budget guard) before this node's trainer started:
    leave the group for good (one node fewer), no replacement."""


class AgentError(Exception):
    """A one-line reason the agent stops (bad job spec, missing code, unreadable checkpoint)."""


class JobFailed(AgentError):
    """The job is marked ``FAILED`` with this reason (exit code 1)."""


class S3Unanswered(AgentError):
    """S3 refused or failed a read of a checkpoint after botocore's retries (throttling, access, outage): the
    checkpoint itself may be good, so the restore stops here instead of skipping it for an older one."""


class LocalDiskError(AgentError):
    """Writing a restored checkpoint to this node's disk failed (full, read-only): the checkpoint is not at fault, so
    the restore stops instead of skipping it for an older one (which a full disk might still hold)."""


class JobRefused(AgentError):
    """No node of the group can run the job: it is wrong, or none was submitted. Not for a failed read.

    ``failed_at``: (bucket, key) of the job's FAILED marker, when the job spec and job id say where it goes."""

    def __init__(self, reason: str, failed_at: Optional[Tuple[str, str]] = None) -> None:
        super().__init__(reason)
        self.failed_at = failed_at


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a log line, a FAILED reason)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        raise AgentError(f"{name}={value!r} is not a number") from None


# The agent's exit codes: 0 job done or instance interrupted cleanly; EXIT_FAILED the job failed (FAILED written);
# EXIT_BAD_INPUT bad input, or no job spec, S3 or Auto Scaling answer at boot.
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
