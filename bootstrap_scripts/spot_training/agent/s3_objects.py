"""S3 object probes: whether a failed read means the object is gone, and S3's own clock of an answer."""

from __future__ import annotations

import datetime
import email.utils
from typing import Any, Dict

from botocore.exceptions import ClientError

from spot_training.agent.errors import AWS_ERRORS
from spot_training.protocol import listed

# What S3 answers when an object is not there (deleted since the listing) or shorter than the range asked for.
GONE_CODES = ("NoSuchKey", "404", "NotFound", "InvalidRange")


def answered_at(response: Dict[str, Any]) -> datetime.datetime:
    """When S3 answered, by S3's own clock (the answer's Date header), to be compared with the LastModified times it
    lists; this node's clock when the header is missing or unreadable."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        when = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError, IndexError):  # None, or not an HTTP date (Python 3.8 raises TypeError for both)
        return datetime.datetime.now(datetime.timezone.utc)
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)


def object_gone(s3: Any, bucket: str, key: str, exc: Exception) -> bool:
    """Whether the failed read ``exc`` of ``key`` means the object is not there: S3 says so, or a listing no longer
    has it (a 403 may be a missing key, see ``protocol.listed``). A listing that fails too says nothing: not gone."""
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
    if code in GONE_CODES:
        return True
    try:
        return listed(s3, bucket, key) is None
    except AWS_ERRORS:
        return False
