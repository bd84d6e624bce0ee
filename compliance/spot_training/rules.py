"""The SpotTraining rules: id, resource types, the finding's message, why it matters, and the check."""

from __future__ import annotations

from compliance.spot_training.auto_scaling import (
    MAX_FINITE_NODES,
    check_mixed_instances,
    check_placement_group_single_az,
    check_rebalance_or_hook,
    check_scale_to_zero,
)
from compliance.spot_training.checkpoint_bucket import check_checkpoint_bucket
from compliance.spot_training.efa import check_efa_on_multi_node_efa_types
from compliance.spot_training.instance_role import check_instance_role_policy
from compliance.spot_training.launch_template import check_launch_template_metadata
from compliance.spot_training.log_group import check_log_retention
from compliance.spot_training.rule import Rule
from compliance.spot_training.security_group import check_security_group_ingress
from compliance.spot_training.warm_volume import check_warm_volume

RULES: tuple[Rule, ...] = (
    Rule("ST1", ("AWS::EC2::LaunchTemplate",),
         "Launch template must require IMDSv2 and allow instance metadata tags: set MetadataOptions "
         "HttpTokens=required and InstanceMetadataTags=enabled (HttpEndpoint enabled or unset).",
         "The boot script reads its identity and spot notices from IMDSv2 and its team/cluster from instance tags.",
         check_launch_template_metadata),
    Rule("ST2", ("AWS::AutoScaling::AutoScalingGroup",),
         "Spot Auto Scaling group must use a MixedInstancesPolicy with at least 2 instance types and "
         "SpotAllocationStrategy price-capacity-optimized, capacity-optimized or capacity-optimized-prioritized.",
         "One instance type in one pool is the likeliest to be reclaimed all at once and to find no capacity.",
         check_mixed_instances),
    Rule("ST3", ("AWS::AutoScaling::AutoScalingGroup",),
         "Group in a cluster placement group must span exactly one subnet/AZ: give it one subnet.",
         "A cluster placement group lives in one AZ; more subnets make launches fail.",
         check_placement_group_single_az),
    Rule("ST4", ("AWS::AutoScaling::AutoScalingGroup",),
         "Multi-node group needs CapacityRebalance: true or a termination lifecycle hook.",
         "Without either, an interrupted node is replaced only after it is gone, stalling every other node.",
         check_rebalance_or_hook),
    Rule("ST5", ("AWS::AutoScaling::AutoScalingGroup",),
         "Group must be able to scale to zero and have a finite size: set MinSize 0, no DesiredCapacity (or 0) and "
         f"MaxSize 1-{MAX_FINITE_NODES}.",
         "Jobs start by setting the group's size and end by setting it to 0; a MinSize or DesiredCapacity above 0 "
         "or an unbounded MaxSize burns money when idle.",
         check_scale_to_zero),
    Rule("ST6", ("AWS::S3::Bucket",),
         "Checkpoint bucket must be versioned, encrypted, TLS-only (bucket policy), block public access and "
         "abort incomplete multipart uploads (lifecycle rule).",
         "Checkpoints are the job's only state; interrupted multipart uploads otherwise cost storage forever.",
         check_checkpoint_bucket),
    Rule("ST7", ("AWS::Logs::LogGroup",),
         "Log group needs a retention period: set RetentionInDays.",
         "Training logs grow with every job and restart; unbounded retention is an unbounded bill.",
         check_log_retention),
    Rule("ST8", ("AWS::EC2::Volume",),
         "Warm-pool volume must be encrypted and in the AZ of its cluster's group.",
         "A volume in another AZ can never be attached to the cluster's nodes; it only costs.",
         check_warm_volume),
    Rule("ST9", ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role"),
         "Instance role must not allow S3 or SSM parameter actions (reads included), or EC2 volume or Auto Scaling "
         "write actions, on Resource '*': scope them to the cluster's bucket prefix, parameters, pool volumes and "
         "group.",
         "A wildcard lets one team's node touch every team's checkpoints, volumes and groups.",
         check_instance_role_policy),
    Rule("ST10", ("AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress"),
         "Security group must not allow ingress from 0.0.0.0/0 or ::/0 (nor from a parameter that can be one): "
         "allow the cluster's own group only.",
         "Training nodes talk only to each other; access is through SSM Session Manager.",
         check_security_group_ingress),
    Rule("ST11", ("AWS::AutoScaling::AutoScalingGroup",),
         "Multi-node group of EFA instance types in a cluster placement group should launch with EFA interfaces: "
         "give its launch template NetworkInterfaces of InterfaceType efa (team file: efa: auto or true).",
         "Without EFA, NCCL's all-reduce between nodes runs over TCP on the ordinary interface, a fraction of the "
         "network those instances are billed for.",
         check_efa_on_multi_node_efa_types, severity="warning"),
)  # fmt: skip
