"""NCCL over EFA: the environment the trainer gets on a cluster whose nodes have EFA interfaces (``Job.efa``).

The Deep Learning AMI carries libfabric with its EFA provider and the aws-ofi-nccl plugin, through which NCCL sends
over EFA. The agent sets:

- ``FI_PROVIDER=efa``: libfabric uses the EFA provider only, so a node whose EFA is missing fails at NCCL's start
  instead of training over TCP at a fraction of the bandwidth;
- on the types with GPUDirect RDMA (:data:`RDMA_FAMILIES`) ``FI_EFA_USE_DEVICE_RDMA=1`` (GPU memory to GPU memory
  across nodes) and ``RDMAV_FORK_SAFE=1`` (a DataLoader's forked workers keep the registered memory intact), as
  SageMaker's training toolkit sets them for the same types.

A variable the node's environment already holds keeps its value (the AMI or the user data may tune it), and a job
overrides any of them by setting it in its own process before it starts ``torch.distributed``. The agent logs once
what it set and what it kept.
"""

from __future__ import annotations

from typing import Dict, Optional

from spot_training.agent.errors import IMDS_ERRORS
from spot_training.agent.node import Node

# Instance families whose EFA does RDMA reads and writes (GPUDirect RDMA): EC2's user guide, "Elastic Fabric Adapter
# for AI/ML and HPC workloads", supported instance types; SageMaker's training toolkit (SM_EFA_RDMA_INSTANCES).
# EC2's DescribeInstanceTypes does not say it.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "trn1", "trn1n", "trn2"})


def efa_environment(instance_type: Optional[str]) -> Dict[str, str]:
    """The variables NCCL needs for EFA on ``instance_type`` (None: unknown, so no RDMA)."""
    env = {"FI_PROVIDER": "efa"}
    family = (instance_type or "").split(".", 1)[0]
    if family in RDMA_FAMILIES:
        env.update({"FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"})
    return env


class EfaEnvironment:
    """Adds :func:`efa_environment` to the trainer's environment on an EFA cluster, below what it already holds."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.wanted: Optional[Dict[str, str]] = None  # read at the first EFA attempt, logged then

    def apply(self, efa: bool, env: Dict[str, str]) -> None:
        """Set the EFA variables in ``env`` (the trainer's) where it has none; nothing unless ``efa``."""
        if not efa:
            return
        first = self.wanted is None
        if self.wanted is None:
            self.wanted = efa_environment(self._instance_type())
        kept = {n: env[n] for n, v in self.wanted.items() if n in env and env[n] != v}
        for name, value in self.wanted.items():
            env.setdefault(name, value)
        if first:
            set_here = ", ".join(f"{n}={v}" for n, v in self.wanted.items() if n not in kept)
            note = f"; kept from the environment: {', '.join(f'{n}={v}' for n, v in kept.items())}" if kept else ""
            self.node.log(f"EFA: NCCL over EFA with {set_here or 'nothing of its own'}{note}")

    def _instance_type(self) -> Optional[str]:
        try:
            return self.node.imds.get("instance-type")
        except IMDS_ERRORS as exc:
            self.node.log(f"IMDS instance-type unreadable ({exc}); EFA without GPUDirect RDMA settings")
            return None
