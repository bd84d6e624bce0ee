"""A job's setup, env, secrets and inputs through a whole node (its real user data): the trainer gets them; the next
node that claims the same warm volume skips the setup and keeps the input; a setup that fails ends the job FAILED
with its last lines, once; a secret that cannot be read ends it FAILED naming the secret."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from .conftest import TEAM, Cluster, address_map
from .test_warm_claim import _cluster, _volume

SETUP = 'echo "setup for $GREETING"\necho built > "$SPOT_TRAINING_SETUP_CACHE_DIR/built"\n'
TRAIN = """import hashlib, os
root = os.environ.get("SPOT_TRAINING_NODE_ROOT", "")
cache = os.environ["SPOT_TRAINING_SETUP_CACHE_DIR"]
print("greeting", os.environ["GREETING"], "built", open(os.path.join(cache, "built")).read().strip())
print("token sha256", hashlib.sha256(os.environ["TOKEN"].encode()).hexdigest())
print("input", open(root + "/data/x/part-0.txt").read().strip())
"""


def _job(cluster: Cluster, job_id: str, token: str, setup: str = SETUP) -> str:
    """A data bucket the job spec lists, an SSM SecureString under the team's prefix; the job submitted."""
    data = f"data-{cluster.name}"
    cluster.aws.s3.create_bucket(Bucket=data)
    cluster.aws.s3.put_object(Bucket=data, Key="ds/part-0.txt", Body=b"rows 0-9")
    cluster.spec["data_buckets"] = [data]
    cluster.put_spec()
    parameter = f"/spot-training-secrets/{TEAM}/{uuid.uuid4().hex[:8]}/token"
    cluster.aws.ssm.put_parameter(Name=parameter, Value=token, Type="SecureString", Overwrite=True)
    parts = {
        "setup": "setup.sh",
        "env": {"GREETING": "hello"},
        "secrets": {"TOKEN": f"ssm:{parameter}"},
        "inputs": [{"s3": f"s3://{data}/ds", "path": "/data/x"}],
    }
    cluster.submit(job_id, {"train.py": TRAIN, "setup.sh": setup}, "python train.py", **parts)
    return parameter


def test_the_trainer_gets_them_and_the_next_node_on_the_volume_skips_the_work(
    make_cluster: Any, make_nodes: Any, tmp_path: Path
) -> None:
    cluster, pool = _cluster(make_cluster)
    volume = _volume(cluster, pool)
    token = f"planted-{uuid.uuid4().hex}"
    _job(cluster, "parts-1", token)
    env = {"SPOT_TRAINING_WARM_VOLUME_MOUNT": "0", "SPOT_TRAINING_WARM_VOLUME_DIRS": str(tmp_path / "volumes")}
    (first,) = make_nodes(cluster)
    assert first.start(address_map([first]), **env).wait() == 0, first.text
    assert cluster.marker("parts-1", "DONE") is not None
    assert "setup for hello" in first.text and "greeting hello built built" in first.text
    assert f"token sha256 {hashlib.sha256(token.encode()).hexdigest()}" in first.text
    assert "input rows 0-9" in first.text
    assert "input s3://" in first.text and "1 object(s) fetched, 0 kept on the warm volume, 0 removed" in first.text
    assert token not in first.text

    cluster.submit("parts-2", {"train.py": TRAIN, "setup.sh": SETUP}, "python train.py", **_parts_of(cluster))
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=1)
    (second,) = make_nodes(cluster)
    assert second.start(address_map([second]), **env).wait() == 0, second.text
    assert f"claimed warm volume {volume}" in second.text
    assert "setup: cached on the warm volume" in second.text and "setup for hello" not in second.text
    assert "0 object(s) fetched, 1 kept on the warm volume, 0 removed" in second.text
    assert "greeting hello built built" in second.text


def _parts_of(cluster: Cluster) -> dict[str, Any]:
    current = cluster.aws.ssm.get_parameter(Name=cluster.current_parameter)["Parameter"]["Value"]
    return {k: v for k, v in json.loads(current).items() if k in ("setup", "env", "secrets", "inputs")}


def test_a_failing_setup_ends_the_job_failed_with_its_last_lines(make_cluster: Any, make_nodes: Any) -> None:
    cluster = make_cluster()
    _job(cluster, "bad-setup", "x", setup="echo fetching\necho 'no wheel: tinypkg'\nexit 7\n")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 1, node.text
    failed = cluster.marker("bad-setup", "FAILED")
    assert failed is not None
    assert failed["reason"] == "setup setup.sh exited with code 7; its last lines: fetching | no wheel: tinypkg"
    assert node.text.count("setup: running bash setup.sh") == 1  # no restart loop


def test_a_secret_that_cannot_be_read_fails_the_job_naming_it(make_cluster: Any, make_nodes: Any) -> None:
    cluster = make_cluster()
    parameter = _job(cluster, "no-secret", "x")
    cluster.aws.ssm.delete_parameter(Name=parameter)
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 1, node.text
    failed = cluster.marker("no-secret", "FAILED")
    assert failed is not None
    assert failed["reason"] == f"secret TOKEN (ssm:{parameter}) cannot be read: ParameterNotFound"
