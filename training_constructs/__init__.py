"""Reusable constructs for spot training clusters.

Named ``training_constructs`` (not ``constructs``): a package called ``constructs`` would shadow
the ``constructs`` library that aws-cdk-lib itself imports.
"""

from training_constructs.checkpoint_store import CheckpointStore
from training_constructs.network import ClusterNetwork
from training_constructs.spot_fleet import SpotFleet
from training_constructs.training_cluster import TrainingCluster
from training_constructs.training_logs import TrainingLogs
from training_constructs.warm_volume_pool import WarmVolumePool

__all__ = ["CheckpointStore", "ClusterNetwork", "SpotFleet", "TrainingCluster", "TrainingLogs", "WarmVolumePool"]
