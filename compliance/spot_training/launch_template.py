"""ST1: the launch template's instance metadata options."""

from __future__ import annotations

from compliance.spot_training.template import Resource, Template, props


def check_launch_template_metadata(_: str, resource: Resource, __: Template) -> list[str]:
    options = props(resource).get("LaunchTemplateData", {}).get("MetadataOptions", {})
    problems = []
    if options.get("HttpTokens") != "required":
        problems.append(f"HttpTokens is {options.get('HttpTokens')!r}")
    if options.get("InstanceMetadataTags") != "enabled":
        problems.append(f"InstanceMetadataTags is {options.get('InstanceMetadataTags')!r}")
    if options.get("HttpEndpoint", "enabled") != "enabled":  # off: no identity and no spot notice at all
        problems.append(f"HttpEndpoint is {options.get('HttpEndpoint')!r}")
    return problems
