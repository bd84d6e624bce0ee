#!/usr/bin/env bash
# User-data entry on every training node. The launch template's user data unpacks this directory to
# /opt/spot-training/bootstrap and runs:
#   user_data.sh --region R --team T --cluster C --job-spec-parameter /spot-training/T/C/job-spec
# Reads the instance identity from IMDSv2 (instance id, region, AZ, launch index, instance tags), checks it
# against the arguments, and hands over to the node agent (node_agent.py) under a supervisor (run_agent.sh: systemd on
# a real instance, a loop elsewhere). Installs only the reboot hook and the hand-back script (below).
#
# Environment:
#   AWS_EC2_METADATA_SERVICE_ENDPOINT  IMDS base URL (default http://169.254.169.254); an emulator points it
#                                      at its per-instance metadata mock. botocore honours the same variable.
#   SPOT_TRAINING_AGENT_PYTHON         interpreter for the agent; otherwise the first of python3 (PATH),
#                                      /opt/pytorch/bin/python (PyTorch DLAMI) and /opt/conda/bin/python3
#                                      that is 3.8+ and imports boto3. The job spec's
#                                      `python` (the environment with torch) runs the trainer, via the agent.
#   SPOT_TRAINING_PER_BOOT_DIR         where the reboot hook goes (created if missing); default cloud-init's
#                                      /var/lib/cloud/scripts/per-boot, used only if it exists. An emulator sets
#                                      it to the node's own directory.
# Reboots: cloud-init runs user data once per instance, so after a reboot no agent would run while the instance
# stays InService and billed. Before it hands over, this script installs a per-boot script (cloud-init runs
# scripts-per-boot before user data, so not on this first boot) that hands the instance back to its group on any
# later boot, without decrementing desired capacity: the group launches a replacement (the agent's state, its
# rendezvous and checkpoint sync did not survive the reboot).
# Handing the instance back, both complete the group's drain hook (DRAIN_HOOK in spot_training/job_spec.py) for it:
# it would otherwise hold the instance, billed, in Terminating:Wait for the hook's heartbeat.
# Exit status 2 with a one-line reason on bad arguments, an identity mismatch or no usable Python. Once the
# instance id and group are known, such a failure first hands the instance back (it leaves its group, one fewer
# desired, with the AWS CLI every DLAMI has): no agent runs to do it, and an idle node would be billed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMDS="${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
IMDS="${IMDS%/}"

log() { printf '%s user-data %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }
DRAIN_HOOK=spot-training-drain
# The instance's lifecycle state in its group ("None": in no group; "" if unknown). Args: AWS CLI, region, instance id.
lifecycle_state() {
  "$1" autoscaling describe-auto-scaling-instances --region "$2" --instance-ids "$3" --output text \
    --query 'AutoScalingInstances[0].LifecycleState' --cli-connect-timeout 10 --cli-read-timeout 20 2>/dev/null ||
    true
}
# Complete the drain hook for this instance once its group holds it in Terminating:Wait (that state begins a moment
# after the terminate call: a few tries). Out of the group already (a group without the hook): nothing to do.
# Args: AWS CLI, region, group, instance id, hook name.
complete_drain() {
  local try state
  for try in 1 2 3 4 5 6; do
    state="$(lifecycle_state "$1" "$2" "$4")"
    case "$state" in
      None | Terminated | Terminating:Proceed) return 0 ;;
      Terminating:Wait)
        if "$1" autoscaling complete-lifecycle-action --region "$2" --auto-scaling-group-name "$3" \
          --instance-id "$4" --lifecycle-hook-name "$5" --lifecycle-action-result CONTINUE \
          --cli-connect-timeout 10 --cli-read-timeout 20 >/dev/null 2>&1; then
          return 0
        fi
        ;;
    esac
    sleep "$try"
  done
  printf '%s could not complete lifecycle hook %s for %s: group %s ends it after the heartbeat timeout\n' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$5" "$4" "$3" >&2
}
INSTANCE_ID="" ASG_NAME=""
hand_back() {
  [[ -n "$INSTANCE_ID" ]] || return 0
  # The group's name comes from the instance's tags; without it (a tag read that failed), Auto Scaling names it.
  local group="$ASG_NAME"
  if [[ -z "$group" ]]; then
    group="$(aws autoscaling describe-auto-scaling-instances --region "$REGION" --instance-ids "$INSTANCE_ID" \
      --output text --query 'AutoScalingInstances[0].AutoScalingGroupName' \
      --cli-connect-timeout 10 --cli-read-timeout 20 2>/dev/null || true)"
    [[ "$group" != None ]] || group=""
  fi
  if aws autoscaling terminate-instance-in-auto-scaling-group --region "$REGION" --instance-id "$INSTANCE_ID" \
    --should-decrement-desired-capacity --cli-connect-timeout 10 --cli-read-timeout 20 >/dev/null 2>&1; then
    log "instance $INSTANCE_ID leaves group ${group:-?} (one fewer desired)"
    [[ -z "$group" ]] || complete_drain aws "$REGION" "$group" "$INSTANCE_ID" "$DRAIN_HOOK"
  else
    log "could not hand instance $INSTANCE_ID back to group ${group:-?}: terminate it by hand"
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

# A refused connection is tried again too (curl does not by default), for up to 2 minutes: until the instance id is
# known nothing can hand the instance back, and it would stay up, billed, with no agent.
TOKEN="$(curl -sf --max-time 5 --retry 8 --retry-connrefused --retry-max-time 120 -X PUT "$IMDS/latest/api/token" \
  -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600')" || die "no IMDSv2 token from $IMDS"
imds() {
  curl -sf --max-time 5 --retry 2 --retry-connrefused -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/latest/meta-data/$1"
}

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

# The hand-back script: hands the instance back to its group (no decrement: the group launches a replacement) and
# completes its drain hook; its first argument says why (default: a reboot). Values baked in with printf %q
# (shell-quoted), so no metadata value can run as code. Args: the script's path.
write_hand_back() {
  local tmp="$1.tmp.$$"
  if {
    printf '#!/usr/bin/env bash\n'
    printf '# Installed by spot-training user_data.sh at the first boot of this instance: run by the reboot hook (cloud-init\n'
    printf '# runs user data once per instance: after a reboot no node agent runs) and when the agent keeps crashing.\n'
    # the AWS CLI found now: a later boot's cloud-init may run the hook with a shorter PATH
    printf 'INSTANCE_ID=%q REGION=%q ASG_NAME=%q AWS_CLI=%q DRAIN_HOOK=%q\n' "$INSTANCE_ID" "$REGION" \
      "${ASG_NAME:-its group}" "$(command -v aws || echo aws)" "$DRAIN_HOOK"
    declare -f lifecycle_state complete_drain
    cat <<'HOOK'
why="${1:-rebooted (its node agent does not run again)}"
printf '%s spot-training hand-back: instance %s %s; handing it back to group %s, which launches a replacement\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$INSTANCE_ID" "$why" "$ASG_NAME" >&2
if ! "$AWS_CLI" autoscaling terminate-instance-in-auto-scaling-group --region "$REGION" --instance-id "$INSTANCE_ID" \
  --no-should-decrement-desired-capacity --cli-connect-timeout 10 --cli-read-timeout 20 >/dev/null; then
  # refused because its group is ending it already? Then completing the drain hook lets it go.
  if [[ "$(lifecycle_state "$AWS_CLI" "$REGION" "$INSTANCE_ID")" != Terminating:Wait ]]; then
    printf 'spot-training hand-back: could not hand instance %s back to group %s: terminate it by hand\n' \
      "$INSTANCE_ID" "$ASG_NAME" >&2
    exit 1
  fi
fi
complete_drain "$AWS_CLI" "$REGION" "$ASG_NAME" "$INSTANCE_ID" "$DRAIN_HOOK"
HOOK
  } >"$tmp" && chmod 0755 "$tmp" && mv -f "$tmp" "$1"; then
    return 0
  fi
  rm -f "$tmp"
  return 1
}

# The reboot hook: the hand-back script in cloud-init's per-boot scripts.
install_reboot_hook() {
  local dir="${SPOT_TRAINING_PER_BOOT_DIR:-/var/lib/cloud/scripts/per-boot}"
  if [[ -n "${SPOT_TRAINING_PER_BOOT_DIR:-}" ]]; then
    mkdir -p "$dir" || { log "cannot create $dir: no reboot hook (a reboot would leave this instance idle)"; return 0; }
  elif [[ ! -d "$dir" ]]; then
    log "no $dir (no cloud-init?): no reboot hook (a reboot would leave this instance idle)"
    return 0
  fi
  if write_hand_back "$dir/spot-training-reboot.sh"; then
    log "reboot hook installed: $dir/spot-training-reboot.sh"
  else
    log "could not install the reboot hook in $dir (a reboot would leave this instance idle)"
  fi
}
install_reboot_hook

# The agent's work directory (as spot_training/agent/settings.py has it) holds the hand-back script run_agent.sh
# runs once the agent has crashed more often than it restarts it.
WORK_DIR="${SPOT_TRAINING_WORK_DIR:-${SPOT_TRAINING_NODE_ROOT:-}/opt/spot-training/work}"
mkdir -p "$WORK_DIR" && write_hand_back "$WORK_DIR/hand-back.sh" || die "cannot write $WORK_DIR/hand-back.sh"

exec bash "$HERE/run_agent.sh" "$WORK_DIR/hand-back.sh" "$PYTHON" -- --region "$REGION" --team "$TEAM" \
  --cluster "$CLUSTER" --job-spec-parameter "$SPEC_PARAMETER" --instance-id "$INSTANCE_ID" --availability-zone "$AZ" \
  --launch-index "$LAUNCH_INDEX" --asg-name "$ASG_NAME"
