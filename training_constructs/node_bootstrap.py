"""NodeBootstrap: the bootstrap scripts as an S3 asset, and the user data that fetches them and starts them."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "bootstrap_scripts"
# What a checkout leaves next to the scripts (tool caches, bytecode) is not shipped: it would be hashed on every
# synth, uploaded, downloaded by every node, and change the asset hash (and so the launch template) for nothing.
BOOTSTRAP_EXCLUDE = [".*", "__pycache__", "*.pyc"]
INSTALL_DIR = "/opt/spot-training"


def hand_back_unless(command: str, failure: str, *, region: str, tries: int = 3, pause_s: int = 10) -> list[str]:
    """Shell lines: run ``command`` up to ``tries`` times; if it never succeeds, the instance leaves its group (one
    fewer desired), completes the group's drain hook for itself (or the hook would hold it, billed, for its
    heartbeat) and the user data exits 2. Before the bootstrap scripts are on disk no agent runs to do it, and
    the instance would idle in the group, billed, counted as a peer."""
    imds = "${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
    return [
        f"for try in $(seq {tries}); do",
        f"  if {command}; then break; fi",
        f'  if [ "$try" = {tries} ]; then',
        f"    token=$(curl -sf --max-time 5 -X PUT {imds}/latest/api/token "
        "-H 'X-aws-ec2-metadata-token-ttl-seconds: 300') || true",
        f'    id=$(curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $token" {imds}/latest/meta-data/instance-id) '
        "|| true",
        f'    echo "user-data: error: {failure} ({tries} tries); instance $id leaves its group (one fewer desired)" '
        ">&2",
        f'    aws autoscaling terminate-instance-in-auto-scaling-group --region {region} --instance-id "$id" '
        "--should-decrement-desired-capacity >/dev/null || true",
        f'    group=$(curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $token" '
        f"{imds}/latest/meta-data/tags/instance/aws:autoscaling:groupName) || true",
        "    for pause in 1 2 3 4; do",  # Terminating:Wait begins a moment after the terminate call
        f'      if aws autoscaling complete-lifecycle-action --region {region} --auto-scaling-group-name "$group" '
        f'--lifecycle-hook-name {DRAIN_HOOK} --instance-id "$id" --lifecycle-action-result CONTINUE >/dev/null 2>&1; '
        "then break; fi",
        '      sleep "$pause"',
        "    done",
        "    exit 2",
        "  fi",
        f"  sleep {pause_s}",
        "done",
    ]


class NodeBootstrap(s3_assets.Asset):
    """``bootstrap_scripts/`` as an S3 asset, and ``user_data``: download and unpack it (three tries, else the
    instance hands itself back), then run ``user_data.sh`` with the cluster's identity and job-spec parameter."""

    def __init__(
        self, scope: Construct, construct_id: str, *, team: str, cluster: str, job_spec_parameter: str
    ) -> None:
        super().__init__(scope, construct_id, path=str(BOOTSTRAP_DIR), exclude=BOOTSTRAP_EXCLUDE)
        self.user_data = ec2.UserData.for_linux()
        self.user_data.add_commands("set -euo pipefail", "fetch_bootstrap() {")
        archive = self.user_data.add_s3_download_command(
            bucket=self.bucket,
            bucket_key=self.s3_object_key,
            local_file=f"{INSTALL_DIR}/bootstrap.zip",
            region=Aws.REGION,
        )
        self.user_data.add_commands(
            f"python3 -m zipfile -e {archive} {INSTALL_DIR}/bootstrap",
            "}",
            *hand_back_unless("fetch_bootstrap", "could not fetch the bootstrap scripts", region=Aws.REGION),
            f"exec bash {INSTALL_DIR}/bootstrap/user_data.sh --region {Aws.REGION} --team {team} "
            f"--cluster {cluster} --job-spec-parameter {job_spec_parameter}",
        )

    def read_statement(self) -> iam.PolicyStatement:
        """Reading the scripts' archive, nothing else of the assets bucket."""
        return iam.PolicyStatement(
            sid="ReadBootstrapScripts",
            actions=["s3:GetObject"],
            resources=[self.bucket.arn_for_objects(self.s3_object_key)],
        )
