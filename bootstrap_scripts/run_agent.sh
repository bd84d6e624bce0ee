#!/usr/bin/env bash
# Runs the node agent supervised, so that an agent that dies (an OOM kill, a crash) comes back instead of leaving the
# instance InService, billed, with nobody to end the job. Started by user_data.sh (last step):
#   run_agent.sh HAND_BACK PYTHON -- AGENT_ARGS...
# HAND_BACK is the script that hands the instance back to its group (no decrement: the group launches a
# replacement) and completes its drain hook; PYTHON runs node_agent.py with AGENT_ARGS.
#
# The agent's own exits end the supervision: 0 (job done, instance interrupted cleanly), 1 (job failed, FAILED
# written), 2 (bad input: it left its group). Any other end (killed by a signal, an interpreter that died) is a
# crash: the agent is started again, and on its start it ends the trainer the dead agent left running
# (spot_training/agent/leftovers.py). After SPOT_TRAINING_AGENT_RESTARTS restarts (default 3) the next crash hands
# the instance back.
#
# Where systemd runs (a real instance), the agent is a systemd service: Restart=on-failure, the same exit statuses
# count as success, a stop timeout under the 2-minute spot notice, KillMode=mixed (a stop sends SIGTERM to the agent
# alone: it stops its trainer itself, with the checkpoint), and OnFailure= runs HAND_BACK once the restarts are used
# up. Elsewhere (the emulated cloud's nodes, which set SPOT_TRAINING_NODE_ROOT) a loop in this script does the same.
#   SPOT_TRAINING_SUPERVISOR   auto (default), systemd or loop
#   SPOT_TRAINING_SYSTEMD_DIR  where the units go (default /etc/systemd/system)
set -euo pipefail

HAND_BACK="$1" PYTHON="$2"
shift 2
[[ "${1:-}" == -- ]] && shift
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
AGENT=("$PYTHON" "$HERE/node_agent.py" "$@")
RESTARTS="${SPOT_TRAINING_AGENT_RESTARTS:-3}"
[[ "$RESTARTS" =~ ^[0-9]+$ ]] || { printf 'run_agent: error: SPOT_TRAINING_AGENT_RESTARTS=%s is not a number\n' \
  "$RESTARTS" >&2; exit 2; }
UNIT=spot-training-agent

log() { printf '%s run-agent %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }

# The ending of an exit status, for the log: "exit status N" or "signal NAME".
ending() {
  if (($1 > 128)); then printf 'signal %s' "$(kill -l "$(($1 - 128))" 2>/dev/null || echo "$(($1 - 128))")"
  else printf 'exit status %s' "$1"; fi
}

use_systemd() {
  case "${SPOT_TRAINING_SUPERVISOR:-auto}" in
    systemd) return 0 ;;
    loop) return 1 ;;
    auto) [[ -z "${SPOT_TRAINING_NODE_ROOT:-}" && -d /run/systemd/system ]] && command -v systemctl >/dev/null ;;
    *) printf 'run_agent: error: SPOT_TRAINING_SUPERVISOR=%s (auto, systemd or loop)\n' \
      "$SPOT_TRAINING_SUPERVISOR" >&2; exit 2 ;;
  esac
}

# The agent's and the hand-back's units; the agent's environment (the SPOT_TRAINING_ and AWS_ variables this
# script has) in an environment file beside them.
write_units() {
  local dir="$1" quoted arg
  quoted=""
  for arg in "${AGENT[@]}"; do quoted+=" $(printf '%q' "$arg")"; done
  env | grep -E '^(SPOT_TRAINING_|AWS_)[A-Za-z0-9_]*=' | grep -vE '^SPOT_TRAINING_(SUPERVISOR|SYSTEMD_DIR)=' >"$dir/$UNIT.env" || true
  chmod 0600 "$dir/$UNIT.env"
  cat >"$dir/$UNIT.service" <<UNITFILE
[Unit]
Description=Spot training node agent (installed by spot-training user_data.sh)
After=network-online.target
Wants=network-online.target
# One start and $RESTARTS restarts an hour; then the unit fails and OnFailure= hands the instance back.
StartLimitIntervalSec=3600
StartLimitBurst=$((RESTARTS + 1))
OnFailure=$UNIT-hand-back.service

[Service]
Type=simple
EnvironmentFile=$dir/$UNIT.env
ExecStart=$quoted
Restart=on-failure
RestartSec=5
# 1: the job failed (FAILED written); 2: bad input (the agent left its group). Both are the agent's own ends.
SuccessExitStatus=1 2
# Under the 2-minute spot notice: the agent's SIGTERM handling (a checkpoint, its upload) has the rest.
TimeoutStopSec=100
KillMode=mixed
StandardOutput=journal+console
StandardError=journal+console
UNITFILE
  cat >"$dir/$UNIT-hand-back.service" <<UNITFILE
[Unit]
Description=Hand the instance back to its group: the spot training node agent kept crashing

[Service]
Type=oneshot
ExecStart=$(printf '%q' "$HAND_BACK") "its node agent crashed $((RESTARTS + 1)) times"
UNITFILE
}

run_under_systemd() {
  local dir="${SPOT_TRAINING_SYSTEMD_DIR:-/etc/systemd/system}"
  write_units "$dir"
  systemctl daemon-reload
  systemctl start "$UNIT.service"
  log "node agent runs as systemd service $UNIT (journalctl -u $UNIT)"
}

run_in_loop() {
  local crashes=0 rc agent stopping=0
  trap 'stopping=1; [[ -z "${agent:-}" ]] || kill -TERM "$agent" 2>/dev/null || true' TERM INT
  while :; do
    "${AGENT[@]}" &
    agent=$!
    rc=0
    wait "$agent" || rc=$?
    if ((stopping)); then  # a TERM while waiting (the trap passed it on): the agent's own exit status
      rc=0
      wait "$agent" || rc=$?
      return "$rc"
    fi
    case "$rc" in 0 | 1 | 2) return "$rc" ;; esac
    crashes=$((crashes + 1))
    if ((crashes > RESTARTS)); then
      log "node agent ended with $(ending "$rc") ($crashes crashes, $RESTARTS restarts used): handing the instance back"
      "$HAND_BACK" "its node agent crashed $crashes times" || true
      return 3
    fi
    log "node agent ended with $(ending "$rc"): starting it again (restart $crashes of $RESTARTS)"
    sleep "${SPOT_TRAINING_AGENT_RESTART_PAUSE_S:-5}"
    if ((stopping)); then  # a TERM during the pause: the instance is going, no new agent
      return "$rc"
    fi
  done
}

if use_systemd; then
  run_under_systemd
else
  run_in_loop
fi
