#!/usr/bin/env bash
# User-data entry on every training node. Called by the launch template's user data with the
# cluster's identity: --region R --team T --cluster C --job-spec-parameter P
# Reads the instance's own identity from IMDSv2 and hands over to the node agent.
set -euo pipefail

IMDS="${IMDS_ENDPOINT:-http://169.254.169.254}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '%s spot-training %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }

TOKEN="$(curl -sf -X PUT "$IMDS/latest/api/token" -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600')"
imds() { curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/latest/meta-data/$1"; }

INSTANCE_ID="$(imds instance-id)"
AZ="$(imds placement/availability-zone)"
LAUNCH_INDEX="$(imds ami-launch-index || echo 0)"
log "instance=$INSTANCE_ID az=$AZ launch-index=$LAUNCH_INDEX args: $*"

if [[ -f "$HERE/node_agent.py" ]]; then
  exec python3 "$HERE/node_agent.py" --instance-id "$INSTANCE_ID" --availability-zone "$AZ" "$@"
fi
log "no node agent shipped yet; identity logged, nothing to run"
