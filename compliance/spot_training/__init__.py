"""SpotTrainingChecks: a cdk-nag rule pack for the mistakes that hurt spot training clusters.

    Validations.of(app).add_plugins(AwsSolutionsChecks(app), SpotTrainingChecks(app))

Each rule reads the resource as it stands in the **synthesized template** (the pack runs after synthesis, so
raw property overrides and escape hatches are seen too) and may look at other resources of the same template
(the subnet of a group, the bucket policy of a bucket, the policies of a role). A finding is reported as
``SpotTraining-<ID>`` with a one-line message that says how to fix it; acknowledge one like any cdk-nag
finding (``compliance.nag.acknowledge``) with a reason.

The rules are plain functions of (logical id, resource, template), so they are tested on small templates
without a synth: ``tests/test_spot_checks.py``.
"""

from __future__ import annotations

from compliance.spot_training.checkpoint_bucket import CHECKPOINT_ROLE_TAG
from compliance.spot_training.plugin import PACK, SpotTrainingChecks
from compliance.spot_training.rule import Rule
from compliance.spot_training.rules import RULES

__all__ = ["CHECKPOINT_ROLE_TAG", "PACK", "RULES", "Rule", "SpotTrainingChecks"]
