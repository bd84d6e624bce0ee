#!/usr/bin/env bash
# User-data entry on every training node. The launch template's user data unpacks this directory to
# /opt/spot-training/bootstrap and runs:
#   user_data.sh --region R --team T --cluster C --job-spec-parameter /spot-training/T/C/job-spec
# Reads the instance identity from IMDSv2 (instance id, region, AZ, launch index, instance tags), checks it
# against the arguments, and hands over to the node agent (node_agent.py). Installs nothing.
#
# Environment:
#   AWS_EC2_METADATA_SERVICE_ENDPOINT  IMDS base URL (default http://169.254.169.254); an emulator points it
#                                      at its per-instance metadata mock. botocore honours the same variable.
#   SPOT_TRAINING_AGENT_PYTHON         interpreter for the agent; otherwise the first of python3 (PATH),
#                                      /opt/pytorch/bin/python (PyTorch DLAMI) and /opt/conda/bin/python3
#                                      that is 3.8+ and imports boto3. The job spec's
#                                      `python` (the environment with torch) runs the trainer, via the agent.
# Exit status 2 with a one-line reason on bad arguments, an identity mismatch or no usable Python. Once the
# instance id and group are known, such a failure first hands the instance back (it leaves its group, one fewer
# desired, with the AWS CLI every DLAMI has): no agent runs to do it, and an idle node would be billed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMDS="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
IMDS="${IMDS%/}"

log() { printf '%s user-data %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }
INSTANCE_ID="" ASG_NAME=""
hand_back() {
  [[ -n "$INSTANCE_ID" && -n "$ASG_NAME" ]] || return 0
  if aws autoscaling terminate-instance-in-auto-scaling-group --region "$REGION" --instance-id "$INSTANCE_ID" \
    --should-decrement-desired-capacity --cli-connect-timeout 10 --cli-read-timeout 20 >/dev/null 2>&1; then
    log "instance $INSTANCE_ID leaves group $ASG_NAME (one fewer desired)"
  else
    log "could not hand instance $INSTANCE_ID back to group $ASG_NAME: terminate it by hand"
  fi
}
die() {
  hand_back
  printf 'user-data: error: %s\n' "$*" >&2
  exit 2
}

REGION="" TEAM="" CLUSTER="" SPEC_PARAMETER=""
while (($#)); do
  case "$1" in
    --region) REGION="${2:-}"; shift 2 || die "--region needs a value" ;;
    --team) TEAM="${2:-}"; shift 2 || die "--team needs a value" ;;
    --cluster) CLUSTER="${2:-}"; shift 2 || die "--cluster needs a value" ;;
    --job-spec-parameter) SPEC_PARAMETER="${2:-}"; shift 2 || die "--job-spec-parameter needs a value" ;;
    *) die "unknown argument '$1' (usage: user_data.sh --region R --team T --cluster C --job-spec-parameter P)" ;;
  esac
done
[[ -n "$REGION" && -n "$TEAM" && -n "$CLUSTER" && -n "$SPEC_PARAMETER" ]] ||
  die "usage: user_data.sh --region R --team T --cluster C --job-spec-parameter P"

TOKEN="$(curl -sf --max-time 5 --retry 3 -X PUT "$IMDS/latest/api/token" \
  -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600')" || die "no IMDSv2 token from $IMDS"
imds() { curl -sf --max-time 5 --retry 2 -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/latest/meta-data/$1"; }

INSTANCE_ID="$(imds instance-id)" || die "IMDS has no instance-id"
AZ="$(imds placement/availability-zone)" || die "IMDS has no placement/availability-zone"
IMDS_REGION="$(imds placement/region || true)"
LAUNCH_INDEX="$(imds ami-launch-index || echo 0)"
if [[ -n "$IMDS_REGION" && "$IMDS_REGION" != "$REGION" ]]; then
  die "instance is in region $IMDS_REGION but was started with --region $REGION"
fi

# Instance tags (the launch template enables them in metadata); absent tags read as empty.
tag() { imds "tags/instance/$1" 2>/dev/null || true; }
TAG_TEAM="$(tag spot-training:team)"
TAG_CLUSTER="$(tag spot-training:cluster)"
ASG_NAME="$(tag aws:autoscaling:groupName)"
if [[ -z "$TAG_TEAM$TAG_CLUSTER" ]]; then
  log "instance tags not in metadata; trusting --team $TEAM --cluster $CLUSTER"
fi
[[ -z "$TAG_TEAM" || "$TAG_TEAM" == "$TEAM" ]] || die "instance tag spot-training:team=$TAG_TEAM does not match --team $TEAM"
[[ -z "$TAG_CLUSTER" || "$TAG_CLUSTER" == "$CLUSTER" ]] ||
  die "instance tag spot-training:cluster=$TAG_CLUSTER does not match --cluster $CLUSTER"
log "instance=$INSTANCE_ID region=$REGION az=$AZ launch-index=$LAUNCH_INDEX team=$TEAM cluster=$CLUSTER group=${ASG_NAME:-?}"

PYTHON=""
CANDIDATES=(python3 /opt/pytorch/bin/python /opt/conda/bin/python3)
for candidate in "${SPOT_TRAINING_AGENT_PYTHON:-}" "${CANDIDATES[@]}"; do
  [[ -n "$candidate" ]] || continue
  if "$candidate" -c 'import sys, boto3; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
    PYTHON="$candidate"
    break
  fi
done
[[ -n "$PYTHON" ]] || die "no Python 3.8+ with boto3 found (tried \$SPOT_TRAINING_AGENT_PYTHON, ${CANDIDATES[*]})"

exec "$PYTHON" "$HERE/node_agent.py" --region "$REGION" --team "$TEAM" --cluster "$CLUSTER" \
  --job-spec-parameter "$SPEC_PARAMETER" --instance-id "$INSTANCE_ID" --availability-zone "$AZ" \
  --launch-index "$LAUNCH_INDEX" --asg-name "$ASG_NAME"
