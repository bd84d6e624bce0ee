"""Compatibility layer: what moto's CloudFormation (and EC2) lack for our templates, added without editing moto.

moto builds its map of CloudFormation resource types once, on first use, from the *direct* subclasses
of ``moto.core.common_models.CloudFormationModel`` (``moto.cloudformation.parsing.get_model_map``, an
``lru_cache``). importing this package defines the compat models (one module per AWS service); :func:`install` clears
those caches and checks that every type we handle now resolves to our class. It must run in the
server process before the server handles its first request (``emulator.server`` does that).

A resource type moto does not know is *skipped with a warning* and every ``Ref`` to it becomes
``None``, which silently drops the property that referred to it (e.g. the launch template's
``Placement.GroupName``). So every item here creates the real thing, readable through the AWS API,
never a stand-in that makes the deploy "succeed" while weakening what the template says.


What moto lacks, item by item, is in the module of the AWS service each item patches (the item numbers stay the
same, for the references elsewhere): :mod:`~emulator.cfn_compat.ec2` (1 placement groups, 3 volumes, 15 EFA
interfaces), :mod:`~emulator.cfn_compat.s3` (2 bucket policies, 6 bucket policies on requests, 9 buckets),
:mod:`~emulator.cfn_compat.cloudformation` (4 CDK metadata, 10 ExecuteChangeSet), :mod:`~emulator.cfn_compat.ssm` (5
public SSM parameters, 7 SSM parameters with tags), :mod:`~emulator.cfn_compat.autoscaling` (8 Auto Scaling groups,
12 lifecycle hooks), :mod:`~emulator.cfn_compat.budgets` (11 budgets), :mod:`~emulator.cfn_compat.fis` (13 FIS
experiment templates) and :mod:`~emulator.cfn_compat.cloudwatch` (14 CloudWatch alarms). Each replaces a moto
function through :func:`emulator.moto_patch.patch`, which keeps moto's original.

Properties a compat model does not emulate are reported as ``EMULATOR-UNSUPPORTED-PROPERTY`` in the
server log, and :func:`emulator.deploy.deploy` fails on them (as on moto's own "No Moto
CloudFormation support" warnings): a deploy never succeeds with part of a template silently dropped.
"""

from __future__ import annotations

import logging

from moto.core.common_models import CloudFormationModel

# moto's own models first (each module below imports the moto models it replaces before defining its own): of
# several direct subclasses claiming one type, moto's map keeps the last defined. install() checks it is ours.
from emulator.cfn_compat import autoscaling, budgets, cloudformation, cloudwatch, ec2, fis, s3, ssm
from emulator.cfn_compat.base import UNSUPPORTED_PROPERTY
from emulator.cfn_compat.s3 import request_transport
from emulator.cfn_compat.ssm import seed_public_ami_parameters

__all__ = ["COMPAT_MODELS", "UNSUPPORTED_PROPERTY", "install", "request_transport", "seed_public_ami_parameters"]

logger = logging.getLogger(__name__)

COMPAT_MODELS: tuple[type[CloudFormationModel], ...] = (
    ec2.PlacementGroup,
    s3.BucketPolicy,
    ec2.Volume,
    cloudformation.CdkMetadata,
    ssm.SsmParameter,
    autoscaling.AutoScalingGroup,
    s3.Bucket,
    budgets.Budget,
    autoscaling.LifecycleHook,
    fis.ExperimentTemplate,
    cloudwatch.Alarm,
)


def install() -> None:
    """Make moto use the compat models and functions. Idempotent; call before the first request."""
    from moto.cloudformation import parsing

    for service in (ec2, s3, cloudformation):
        service.patch_moto()
    for cache in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cache.cache_clear()
    # Several direct subclasses may claim one type (moto's Volume and ours): the map keeps the last
    # one defined, which is ours because each module imports moto's models first. Check it.
    model_map = parsing.get_model_map()
    wrong = {m.cloudformation_type(): model_map.get(m.cloudformation_type()) for m in COMPAT_MODELS}
    wrong = {t: m for t, m in wrong.items() if m not in COMPAT_MODELS}
    if wrong:
        raise RuntimeError(f"moto's CloudFormation does not use the compat models for: {sorted(wrong)}")
    logger.debug("cfn_compat installed: %s", ", ".join(m.cloudformation_type() for m in COMPAT_MODELS))
