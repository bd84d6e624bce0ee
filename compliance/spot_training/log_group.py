"""ST7: a log group's retention."""

from __future__ import annotations

from compliance.spot_training.template import Resource, Template, props


def check_log_retention(_: str, resource: Resource, __: Template) -> list[str]:
    return [] if props(resource).get("RetentionInDays") else ["no RetentionInDays"]
