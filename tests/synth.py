"""Helpers to synthesize TrainingStacks in-process (one jsii runtime for the whole test run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import App
from aws_cdk.assertions import Template

from stacks import TrainingStack
from team_config import TeamConfig

CONTEXT = json.loads((Path(__file__).resolve().parent.parent / "cdk.json").read_text())["context"]

# A team using every optional feature (existing VPC, on-demand base, warm pool, drill, capacity fallback, SSM AMI, no
# placement group, a budget): the app, security and review tests synthesize it next to the shipped teams.
EVERYTHING: dict[str, Any] = {
    "network": {
        "existing_vpc": {
            "vpc_id": "vpc-0123456789abcdef0",
            "subnets": [
                {
                    "subnet_id": "subnet-0123456789abcdef0",
                    "availability_zone": "us-east-1a",
                    "route_table_id": "rtb-01234567",
                }
            ],
        }
    },
    "budget": {"usd_per_month": 1000},
    "data_buckets": ["everything-datasets", "corpus.example.com"],
    "clusters": [
        {
            "name": "pool",
            "instance_types": ["g5.xlarge", "g6.xlarge"],
            "max_nodes": 2,
            "desired_nodes": 2,
            "on_demand_base_capacity": 1,
            "warm_pool": {"size": 2, "snapshot_id": "snap-0123456789abcdef0"},
            "ami": {"image_id": "ami-0123456789abcdef0"},
            "interruption_drill": {"percent": 100, "notice_minutes": 5},
            "capacity": {"on_demand_after_minutes": 5},
        },
        {
            "name": "arm",
            "instance_types": ["c7g.large", "m7g.large"],
            "max_nodes": 1,
            "placement_group": False,
            "ami": {"ssm_parameter": "/my/ami"},
        },
    ],
}

CLUSTER: dict[str, Any] = {"name": "main", "instance_types": ["g5.xlarge", "g5.2xlarge"], "max_nodes": 2}


def write_app_teams(directory: Path, repo: Path) -> Path:
    """The shipped team files and EVERYTHING's, in ``directory``: what the app tests synthesize."""
    for f in (repo / "teams").glob("*.yaml"):
        (directory / f.name).write_text(f.read_text())
    (directory / "everything.yaml").write_text(json.dumps(EVERYTHING))
    return directory


def team_config(**overrides: Any) -> TeamConfig:
    return TeamConfig.model_validate({"clusters": [CLUSTER], **overrides})


def synth(config: TeamConfig, team: str = "team-a", outdir: str | None = None) -> tuple[TrainingStack, Template]:
    app = App(context=CONTEXT, outdir=outdir)
    stack = TrainingStack(app, f"TrainingStack-{team}", team=team, config=config)
    return stack, Template.from_stack(stack)


def resources(template: Template, type_name: str) -> list[dict[str, Any]]:
    return [dict(r) for r in template.find_resources(type_name).values()]


def joined(value: Any) -> str:
    """Flatten an Fn::Join / Fn::Sub / Ref structure into text, for substring checks."""
    return json.dumps(value, sort_keys=True)


def oversized_team(teams_dir: Path) -> Path:
    """``teams_dir/default.yaml``: a valid team whose stack is over CloudFormation's 500 resources (seven clusters,
    each with a warm pool of 64 volumes), and its path."""
    pool = {"size": 64, "snapshot_id": "snap-0123456789abcdef0"}
    clusters = [
        {
            "name": f"c{i}",
            "instance_types": ["g5.xlarge", "g5.2xlarge"],
            "max_nodes": 64,
            "warm_pool": pool,
            "ami": {"image_id": "ami-0123456789abcdef0"},
        }
        for i in range(7)
    ]
    teams_dir.mkdir()
    path = teams_dir / "default.yaml"
    path.write_text(json.dumps({"clusters": clusters}))  # JSON is YAML
    return path


# What app.py and trainctl review print for it (after "error: " and "trainctl: error: ")
OVERSIZED = (
    "stack TrainingStack would hold {count} CloudFormation resources (448 of them warm pool volumes), more than the "
    "500 one stack may hold; split the clusters across team files (a stack each) or make warm_pool.size smaller"
)
