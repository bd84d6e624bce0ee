"""One entry of the team file's ``clusters``: instance types, node counts, capacity mix and its sections."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from bootstrap_scripts.spot_training.job_spec import JOIN_TIMEOUT_S
from team_config.instance_types import InstanceFacts, closest_instance_type, instance_facts, known_instance_types
from team_config.model.base import InstanceType, Name, Strict, empty_section
from team_config.model.capacity import CapacityConfig
from team_config.model.job import JobConfig
from team_config.model.node import (
    AmiConfig,
    InterruptionDrillConfig,
    WarmPoolConfig,
    instance_architecture,
    rebalancing_pool,
)

# the time an on-demand node takes to boot and join (its agent's peer discovery), allowed for within the join timeout
ON_DEMAND_BOOT_MINUTES = 2


def _efa_value(value: object) -> object:
    """``auto``, ``true`` or ``false``, refused in one line (not one per member of the union)."""
    if value == "auto" or isinstance(value, bool):
        return value
    raise PydanticCustomError("efa_value", "expected auto, true or false; write efa: auto, true or false (no quotes)")


class ClusterConfig(Strict):
    name: Name = Field(description="Cluster name; S3 prefix <name>/ and tag spot-training:cluster.")
    instance_types: list[InstanceType] = Field(
        min_length=1, max_length=40, description="Candidate types, one CPU architecture (Auto Scaling takes 40)."
    )
    min_nodes: int = Field(1, ge=1, description="Fewest nodes training continues with (torchrun --nnodes MIN:MAX).")
    desired_nodes: int = Field(1, ge=1, description="Nodes a job asks for by default.")
    max_nodes: int = Field(ge=1, le=1000, description="Upper bound of the Auto Scaling group.")
    on_demand_base_capacity: int = Field(0, ge=0, description="On-demand nodes before any spot (at most max_nodes).")
    on_demand_percentage_above_base: int = Field(
        0, ge=0, le=100, description="Share of on-demand capacity above the base (100: no spot)."
    )
    spot_allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized"] = Field(
        "price-capacity-optimized", description="How Auto Scaling picks spot pools."
    )
    placement_group: bool = Field(True, description="Launch into a cluster placement group (one AZ).")
    cross_zone_training: bool = Field(
        False,
        description="Let a multi-node cluster span the network's AZs (more spot pools), its traffic between them "
        "billed as inter-AZ data transfer.",
    )
    efa: Annotated[Union[Literal["auto"], bool], BeforeValidator(_efa_value)] = Field(
        "auto",
        description="Elastic Fabric Adapter interfaces for NCCL, one per network card the type allows. auto: on when "
        "the cluster has more than one node (max_nodes), a placement group and only types with EFA; true: on (refused "
        "on a type without EFA, without a placement group or across AZs); false: off.",
    )
    root_volume_size_gib: int = Field(200, ge=8, le=16384, description="Encrypted gp3 root volume size.")
    ami: Annotated[
        AmiConfig,
        BeforeValidator(
            empty_section("give its keys (image_id: ... or ssm_parameter: ...) or remove the line for the default AMI")
        ),
    ] = Field(AmiConfig(), description="The AMI the nodes boot; default: the PyTorch DLAMI of the architecture.")
    job: Annotated[
        JobConfig,
        BeforeValidator(
            empty_section("give its keys (command: ..., nproc_per_node: ...) or remove the line for the defaults")
        ),
    ] = Field(JobConfig(), description="Defaults of the job spec; trainctl submit may override them.")
    warm_pool: Annotated[
        Optional[WarmPoolConfig],
        BeforeValidator(empty_section("give its keys (size: ..., snapshot_id: ...) or remove the line")),
    ] = Field(None, description="A pool of pre-warmed EBS volumes the nodes attach at boot.")
    capacity: Annotated[
        Optional[CapacityConfig],
        BeforeValidator(empty_section("give its keys (on_demand_after_minutes: ...) or remove the line")),
    ] = Field(None, description="What the cluster does when spot capacity does not come (default: wait for spot).")
    interruption_drill: Annotated[
        Optional[InterruptionDrillConfig],
        BeforeValidator(empty_section("write interruption_drill: {} for the defaults, or remove the line")),
    ] = Field(None, description="Create an AWS FIS experiment template that interrupts this cluster's spot instances.")

    @model_validator(mode="after")
    def _nodes(self) -> ClusterConfig:
        # One validator, its checks in this order: a file with several mistakes is told the first one first.
        self._check_node_counts()
        self._check_instance_types()
        self._check_instance_facts()
        self._check_capacity()
        self._check_warm_pool_ami()
        self._check_efa()
        return self

    def _check_efa(self) -> None:
        """``efa: true`` only on types with EFA, in a placement group."""
        if self.efa is not True:
            return
        for name in self.instance_types:
            facts = instance_facts().get(name)
            if facts is None or not facts.efa_interfaces:
                why = "has no EFA" if facts is not None else "has no known EFA facts (moto's data lacks it)"
                raise ValueError(
                    f"efa: true on cluster {self.name}, but {name} {why}; list only EFA types (such as "
                    "p4d.24xlarge, p5.48xlarge) or set efa: auto (off for this cluster)"
                )
        if not self.placement_group:
            raise ValueError(
                f"efa: true on cluster {self.name} ({', '.join(self.instance_types)}) with placement_group: false; "
                "EFA wants its nodes in one cluster placement group: set placement_group: true or efa: false"
            )

    def _check_node_counts(self) -> None:
        if not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise ValueError(
                f"need min_nodes <= desired_nodes <= max_nodes, got {self.min_nodes} <= "
                f"{self.desired_nodes} <= {self.max_nodes}"
            )

    def _check_instance_types(self) -> None:
        """Each type listed once, known to EC2, Linux, of one CPU architecture."""
        if len(set(self.instance_types)) != len(self.instance_types):
            raise ValueError("instance_types: a type is listed twice; list each type once")
        for name in self.instance_types:
            if name not in known_instance_types():
                close = closest_instance_type(name)
                fix = f"did you mean {close}?" if close else "see aws ec2 describe-instance-types"
                raise ValueError(
                    f"instance_types: {name} is not an EC2 instance type ({fix}; a type newer than the pinned boto3: "
                    "upgrade it and run .venv/bin/python -m team_config.instance_types)"
                )
        arches = {t: instance_architecture(t) for t in self.instance_types}
        for name, arch in arches.items():
            if arch.endswith("_mac"):
                raise ValueError(
                    f"instance_types: {name} is an EC2 Mac ({arch}: macOS on a Dedicated Host), which neither spot "
                    "groups nor the Linux training AMIs run on; use x86_64 or arm64 Linux types"
                )
        if len(set(arches.values())) > 1:
            listed = ", ".join(f"{t} ({a})" for t, a in arches.items())
            raise ValueError(f"instance_types mix CPU architectures: {listed}; use types of one architecture")

    def _check_capacity(self) -> None:
        """The on-demand base within the group, a drill only where spot runs, a warm pool for every node."""
        if self.on_demand_base_capacity > self.max_nodes:
            raise ValueError(
                f"on_demand_base_capacity ({self.on_demand_base_capacity}) exceeds max_nodes ({self.max_nodes})"
            )
        no_spot = self.on_demand_percentage_above_base == 100 or self.on_demand_base_capacity >= self.max_nodes
        if self.interruption_drill is not None and no_spot:
            raise ValueError(
                "interruption_drill interrupts spot instances, and this cluster launches none (all on-demand); remove "
                "interruption_drill, or lower on_demand_percentage_above_base / on_demand_base_capacity"
            )
        if self.capacity is not None and self.on_demand_percentage_above_base == 100:
            raise ValueError(
                "capacity.on_demand_after_minutes falls back from spot to on-demand, and this cluster launches no spot "
                "(on_demand_percentage_above_base: 100); remove the capacity section, or lower "
                "on_demand_percentage_above_base"
            )
        self._check_fallback_in_time()
        if self.warm_pool is not None and self.warm_pool.size < self.max_nodes:
            raise ValueError(
                f"warm_pool.size ({self.warm_pool.size}) is below max_nodes ({self.max_nodes}); "
                f"set size to at least max_nodes so every node finds a warm volume (size: "
                f"{rebalancing_pool(self.max_nodes)} also covers the replacements capacity rebalancing launches before "
                "the nodes they replace let their volumes go: up to 10% of max_nodes, at least 1)"
            )

    def _check_fallback_in_time(self) -> None:
        """With min_nodes above 1, the nodes spot did launch wait for the rest at most the agents' join timeout: the
        fallback (its minutes, the watcher's period, ON_DEMAND_BOOT_MINUTES to boot) must come within it."""
        if self.capacity is None or self.min_nodes == 1:
            return
        limit = JOIN_TIMEOUT_S / 60 - ON_DEMAND_BOOT_MINUTES
        if self.capacity.on_demand_after_minutes + self.capacity.check_every_minutes > limit:
            room = limit - self.capacity.check_every_minutes
            c = self.capacity
            raise ValueError(
                f"capacity.on_demand_after_minutes ({c.on_demand_after_minutes:g}) plus check_every_minutes "
                f"({c.check_every_minutes}) leaves on-demand nodes no time to join: with min_nodes {self.min_nodes}, "
                f"the nodes spot launched fail the job after {JOIN_TIMEOUT_S / 60:g} minutes without their peers; set "
                f"on_demand_after_minutes to at most {room:g}, or min_nodes: 1"
            )

    def _check_warm_pool_ami(self) -> None:
        """The warm volumes copy the root of the AMI the nodes boot."""
        pool_ami = self.warm_pool.ami_id if self.warm_pool is not None else None
        if pool_ami is not None and self.ami.ssm_parameter is not None:
            raise ValueError(
                f"warm_pool.ami_id {pool_ami} is a copy of one AMI, but ami.ssm_parameter picks the AMI again at every "
                f"deploy: nodes would mount one AMI's environment over another's; remove ami.ssm_parameter (the nodes "
                f"then boot {pool_ami})"
            )
        if self.warm_pool is not None and pool_ami is None and self.ami.image_id is None:
            raise ValueError(
                f"warm_pool.snapshot_id {self.warm_pool.snapshot_id} copies one AMI's root, but the nodes boot the AMI "
                "an SSM parameter names at each deploy (ami.ssm_parameter, or the default DLAMI's): once it moves on, "
                "nodes would mount one AMI's environment over another's; set ami.image_id to the AMI the snapshot "
                "comes from (or give warm_pool.ami_id instead and resolve it)"
            )
        if pool_ami is not None and self.ami.image_id not in (None, pool_ami):
            raise ValueError(
                f"ami.image_id {self.ami.image_id} differs from warm_pool.ami_id {pool_ami}: nodes would mount one "
                f"AMI's environment over another's; set both to the same AMI (or remove ami.image_id: it defaults to "
                "warm_pool.ami_id)"
            )

    @property
    def nproc_per_node(self) -> int:
        """Processes per node: ``job.nproc_per_node``, or one per GPU of the types (all have the same count; 1 for
        types without GPUs or without known facts). A node of 8 GPUs left at 1 would bill 8 and train on 1."""
        if self.job.nproc_per_node is not None:
            return self.job.nproc_per_node
        gpus = [f.gpus for t in self.instance_types if (f := instance_facts().get(t)) is not None]
        return max(gpus, default=0) or 1

    def _check_instance_facts(self) -> None:
        """GPUs, placement and spot, from EC2's facts of each type (types without known facts are skipped)."""
        facts = {t: f for t in self.instance_types if (f := instance_facts().get(t)) is not None}
        with_gpu = {t: f for t, f in facts.items() if f.gpus}
        if with_gpu and len(with_gpu) != len(facts):
            listed = ", ".join(f"{t} ({f.describe_gpus()})" for t, f in facts.items())
            raise ValueError(f"instance_types mix GPU and non-GPU types: {listed}; use types of one kind")
        counts = {f.gpus for f in with_gpu.values()}
        if len(counts) > 1:
            listed = ", ".join(f"{t} ({f.gpus})" for t, f in with_gpu.items())
            raise ValueError(
                f"instance_types have different GPU counts: {listed}; job.nproc_per_node is one number for every "
                "node: list types with the same GPU count"
            )
        nproc = self.job.nproc_per_node or 0  # unset: the GPU count (nproc_per_node)
        for name, f in with_gpu.items():
            if nproc > f.gpus:
                raise ValueError(
                    f"job.nproc_per_node {nproc} exceeds the {f.describe_gpus()} GPU{'s' * (f.gpus > 1)} of {name}; "
                    "set nproc_per_node "
                    f"to at most {f.gpus} (one process per GPU) or use types with {nproc} GPUs"
                )
        spot = self.on_demand_percentage_above_base < 100
        for name, f in facts.items():
            if self.placement_group and not f.cluster_placement:
                raise ValueError(
                    f"instance_types: {name} cannot launch into a cluster placement group (EC2 does not place it "
                    "there); set placement_group: false or use another type"
                )
            if spot and not f.spot:
                raise ValueError(
                    f"instance_types: {name} is not sold as spot; remove it, or set on_demand_percentage_above_base: "
                    "100 (all on-demand)"
                )
        # SpotTraining-ST2's condition (compliance/spot_training/): unless all capacity above the base is
        # on-demand, the group's MixedInstancesPolicy needs at least 2 instance types.
        if spot and len(set(self.instance_types)) < 2:
            only = self.instance_types[0]
            other = self._similar_type(only)
            such_as = f", such as {other}" if other else ""
            raise ValueError(
                f"instance_types lists one type ({only}), but a spot group needs at least 2 to fall back on "
                f"(SpotTraining-ST2); list a second type with the same GPU count{such_as}, or set "
                "on_demand_percentage_above_base: 100"
            )

    def _similar_type(self, name: str) -> Optional[str]:
        """A type that could join ``name`` here: same architecture and GPUs, sold as spot; the same family and the
        nearest vCPU count first."""
        mine = instance_facts().get(name)
        if mine is None:
            return None

        def fits(f: InstanceFacts) -> bool:
            same = (f.architecture, f.gpus, f.spot) == (mine.architecture, mine.gpus, True)
            return same and (f.cluster_placement or not self.placement_group)

        family = name.split(".", 1)[0]
        candidates = [(t, f) for t, f in instance_facts().items() if t != name and f is not None and fits(f)]
        ranked = sorted(
            candidates,
            key=lambda c: (c[0].split(".", 1)[0] != family, c[1].gpu != mine.gpu, abs(c[1].vcpus - mine.vcpus), c[0]),
        )
        return ranked[0][0] if ranked else None

    @property
    def efa_enabled(self) -> bool:
        """Whether the nodes get EFA interfaces: ``efa``, with ``auto`` resolved (see the field's description)."""
        if self.efa != "auto":
            return bool(self.efa)
        facts = [instance_facts().get(t) for t in self.instance_types]
        all_efa = all(f is not None and f.efa_interfaces for f in facts)
        return all_efa and self.max_nodes > 1 and self.placement_group

    @property
    def efa_interfaces(self) -> dict[str, int]:
        """EFA interfaces per instance type (one per network card the type allows); empty without EFA."""
        if not self.efa_enabled:
            return {}
        return {t: f.efa_layout for t in self.instance_types if (f := instance_facts().get(t)) is not None}

    @property
    def image_id(self) -> Optional[str]:
        """The fixed AMI the nodes boot: ``ami.image_id``, else the warm pool's AMI; None: the SSM parameter."""
        return self.ami.image_id or (self.warm_pool.ami_id if self.warm_pool is not None else None)

    @property
    def architecture(self) -> str:
        return instance_architecture(self.instance_types[0])
