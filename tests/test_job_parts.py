"""bootstrap_scripts/spot_training/job_parts.py: the rules a job's setup, env, secrets and inputs follow, which the
node agent and ``trainctl submit`` both apply; each refusal names the key and says what to write."""

from __future__ import annotations

from typing import Any

import pytest

from bootstrap_scripts.spot_training.job_parts import check_job_parts, secret_prefix, split_s3_url
from bootstrap_scripts.spot_training.job_spec import JOB_KEYS, SPEC_KEYS, JobSpecError

TEAM = "alpha"


def checked(**parts: Any) -> dict[str, Any]:
    merged = {"team": TEAM, "data_buckets": ["alpha-data"], **parts}
    check_job_parts(merged)
    return merged


def test_a_job_without_parts_gets_their_empty_values() -> None:
    merged = checked()
    assert (merged["setup"], merged["env"], merged["secrets"], merged["inputs"]) == (None, {}, {}, [])


def test_good_parts_pass_as_given() -> None:
    parts = {
        "setup": "scripts/setup.sh",
        "env": {"SEED": "3"},
        "secrets": {"HF_TOKEN": f"ssm:/{secret_prefix(TEAM)}hf", "WANDB": f"secretsmanager:{secret_prefix(TEAM)}wb"},
        "inputs": [{"s3": "s3://alpha-data/digits/", "path": "/data/digits"}],
    }
    assert {k: checked(**parts)[k] for k in parts} == parts


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"setup": "/etc/setup.sh"}, "setup must be the path of a script inside the code archive, got '/etc/setup.sh'"),
        ({"setup": "../setup.sh"}, "setup must be the path of a script inside the code archive, got '../setup.sh'"),
        ({"env": {"SEED": 3}}, "env: SEED must be a string (quote it in YAML), got 3"),
        ({"env": {"WORLD_SIZE": "8"}}, "env: WORLD_SIZE is set by the node agent or torchrun; choose another name"),
        (
            {"env": {"SPOT_TRAINING_JOB": "x"}},
            "env: SPOT_TRAINING_JOB is set by the node agent or torchrun; choose another name",
        ),
        ({"env": {"1X": "x"}}, "env: '1X' is not an environment variable name (letters, digits, '_')"),
        (
            {"secrets": {"TOKEN": "vault:hf"}},
            "secrets: TOKEN must be ssm:<parameter name> or secretsmanager:<secret name>, got 'vault:hf'",
        ),
        (
            {"secrets": {"TOKEN": "ssm:/spot-training-secrets/alphabet/hf"}},
            "secrets: TOKEN names '/spot-training-secrets/alphabet/hf', outside the team's secrets "
            "(ssm:/spot-training-secrets/alpha/...); the nodes may read only those",
        ),
        (
            {"secrets": {"TOKEN": "ssm:/spot-training-secrets/alpha/../beta/hf"}},
            "secrets: TOKEN names '/spot-training-secrets/alpha/../beta/hf', outside the team's secrets "
            "(ssm:/spot-training-secrets/alpha/...); the nodes may read only those",
        ),
        (
            {"secrets": {"TOKEN": "secretsmanager:/spot-training-secrets/alpha/hf"}},
            "secrets: TOKEN names '/spot-training-secrets/alpha/hf', outside the team's secrets "
            "(secretsmanager:spot-training-secrets/alpha/...); the nodes may read only those",
        ),
        (
            {"env": {"TOKEN": "x"}, "secrets": {"TOKEN": "ssm:/spot-training-secrets/alpha/hf"}},
            "env and secrets both set TOKEN; set each variable in one of them",
        ),
        (
            {"inputs": [{"s3": "s3://beta-data/x/", "path": "/data"}]},
            "inputs[1].s3: bucket beta-data is not in the team file's data_buckets (alpha-data); ask the team's ops "
            "to add it",
        ),
        (
            {"inputs": [{"s3": "alpha-data/x", "path": "/data"}]},
            "inputs[1].s3 must be s3://bucket/prefix, got 'alpha-data/x'",
        ),
        (
            {"inputs": [{"s3": "s3://alpha-data/x", "path": "data"}]},
            "inputs[1].path must be an absolute directory, got 'data'",
        ),
        (
            {"inputs": [{"s3": "s3://alpha-data/x", "path": "/data"}, {"s3": "s3://alpha-data/y", "path": "/data/y"}]},
            "inputs[2].path /data/y overlaps another input's path; give each its own",
        ),
        ({"data_buckets": "alpha-data"}, "data_buckets must be a list of S3 bucket names, got 'alpha-data'"),
    ],
)
def test_a_bad_part_is_refused_naming_its_key(parts: dict[str, Any], message: str) -> None:
    with pytest.raises(JobSpecError) as refused:
        checked(**parts)
    assert str(refused.value) == message


def test_a_submitted_job_cannot_widen_its_own_data_buckets() -> None:
    """data_buckets is the stack's (the team file's): a key of the job spec, not one a submitted job may set."""
    assert "data_buckets" in SPEC_KEYS and "data_buckets" not in JOB_KEYS


def test_s3_urls_split_into_bucket_and_prefix() -> None:
    assert split_s3_url("s3://alpha-data/digits/train/") == ("alpha-data", "digits/train/")
    assert split_s3_url("s3://alpha-data") == ("alpha-data", "")
    assert split_s3_url("s3://alpha-data/../x") is None
    assert split_s3_url("https://alpha-data/x") is None
