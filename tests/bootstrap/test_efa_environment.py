"""NCCL's EFA environment (``spot_training.agent.efa``): set on an EFA cluster only, GPUDirect RDMA only where the
type has it, below what the environment already holds, logged once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import pytest
from spot_training.agent.efa import EfaEnvironment, efa_environment
from spot_training.job_spec import JobSpecError, check_job

from .conftest import address_map
from .test_job_spec import a_job_spec


class Imds:
    def __init__(self, instance_type: Optional[str]) -> None:
        self.instance_type = instance_type
        self.reads = 0

    def get(self, path: str) -> Optional[str]:
        assert path == "instance-type"
        self.reads += 1
        if self.instance_type is None:
            raise OSError("connection refused")
        return self.instance_type


def node(instance_type: Optional[str]) -> Any:
    lines: list[str] = []
    return SimpleNamespace(imds=Imds(instance_type), log=lines.append, lines=lines)


RDMA = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"}


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [
        ("p4d.24xlarge", RDMA),
        ("p5.48xlarge", RDMA),
        ("g6e.48xlarge", {"FI_PROVIDER": "efa"}),  # EFA without GPUDirect RDMA
        ("c5n.18xlarge", {"FI_PROVIDER": "efa"}),
        (None, {"FI_PROVIDER": "efa"}),
    ],
)
def test_the_efa_variables_follow_the_instance_type(instance_type: Optional[str], expected: dict) -> None:
    assert efa_environment(instance_type) == expected


def test_an_efa_cluster_gets_them_logged_once_and_the_environment_wins() -> None:
    n = node("p4d.24xlarge")
    efa = EfaEnvironment(n)
    env = {"PATH": "/usr/bin", "RDMAV_FORK_SAFE": "0"}  # the node's own setting
    efa.apply(True, env)
    assert env == {"PATH": "/usr/bin", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "0"}
    assert n.lines == [
        "EFA: NCCL over EFA with FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1; "
        "kept from the environment: RDMAV_FORK_SAFE=0"
    ]
    second = {"PATH": "/usr/bin"}
    efa.apply(True, second)  # the next attempt: the same variables, no second line, no second IMDS read
    assert second == {"PATH": "/usr/bin", **RDMA}
    assert len(n.lines) == 1 and n.imds.reads == 1


def test_a_cluster_without_efa_gets_nothing_and_no_line() -> None:
    n = node("p4d.24xlarge")
    env = {"PATH": "/usr/bin"}
    EfaEnvironment(n).apply(False, env)
    assert env == {"PATH": "/usr/bin"} and n.lines == [] and n.imds.reads == 0


def test_an_unreadable_instance_type_means_efa_without_rdma_and_says_so() -> None:
    n = node(None)
    env: dict[str, str] = {}
    EfaEnvironment(n).apply(True, env)
    assert env == {"FI_PROVIDER": "efa"}
    assert n.lines == [
        "IMDS instance-type unreadable (connection refused); EFA without GPUDirect RDMA settings",
        "EFA: NCCL over EFA with FI_PROVIDER=efa",
    ]


SPEC = a_job_spec(nproc_per_node=8, min_nodes=2, desired_nodes=4, max_nodes=4, efa=True).as_dict()
CURRENT = {"job_id": "j1", "code_key": "main/code/j1.tar.gz"}


def test_the_job_spec_says_efa_and_a_spec_without_it_is_off() -> None:
    assert check_job({**SPEC, "efa": True}, CURRENT, "/c")["efa"] is True
    assert check_job({k: v for k, v in SPEC.items() if k != "efa"}, CURRENT, "/c")["efa"] is False
    with pytest.raises(JobSpecError, match=r"^efa must be true or false, got 'yes'$"):
        check_job({**SPEC, "efa": "yes"}, CURRENT, "/c")
    with pytest.raises(JobSpecError, match="unknown key"):
        check_job(SPEC, {**CURRENT, "efa": False}, "/c")  # a cluster's property: no job sets it


PRINTS_PROVIDER = """
import os
print("provider", repr(os.environ.get("FI_PROVIDER")), "rdma", repr(os.environ.get("FI_EFA_USE_DEVICE_RDMA")))
"""


@pytest.mark.parametrize(("efa", "seen"), [(True, "provider 'efa' rdma None"), (False, "provider None rdma None")])
def test_the_agent_gives_the_trainer_the_efa_environment_on_an_efa_cluster_only(
    make_cluster: Any, make_nodes: Any, efa: bool, seen: str
) -> None:
    """The emulated node's IMDS says g5.xlarge: EFA's provider, no GPUDirect RDMA."""
    cluster = make_cluster(nodes=1, efa=efa)
    cluster.submit("efa-run", {"train.py": PRINTS_PROVIDER}, "python train.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait(120) == 0
    assert seen in node.text
    assert node.text.count("EFA: NCCL over EFA with FI_PROVIDER=efa") == (1 if efa else 0)
