"""What the demo reports about a job: its facts read back from S3, CloudWatch Logs and the Auto Scaling API."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bootstrap_scripts.spot_training.protocol import DONE
from emulator.cloud import EmulatorError
from emulator.demo_logs import ACCURACY, DURABLE, RESUMED, STEP, Restart, first_after, restarts
from emulator.demo_run import INTERRUPTIONS, WARNED, JobEvent, JobRun
from emulator.nodes import Node
from trainctl import jobs


@dataclass
class Summary:
    job_id: str
    done: bool
    desired_capacity: int
    nodes_booted: int
    nodes_running_after: int
    steps_trained: int
    interrupted_at_step: int
    resumed_from_step: int
    notice_to_durable_s: Optional[float]  # None when the first interruption came without a notice
    replacement_boot_to_first_step_s: float
    checkpoints: list[jobs.Checkpoint]
    final_accuracy: float
    final_world_size: int
    victim: str
    replacement: str
    log_dir: Path
    nodes: list[Node]
    events: list[JobEvent] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)

    @property
    def steps_redone(self) -> int:
        return self.interrupted_at_step - self.resumed_from_step

    def lines(self) -> list[str]:
        sizes = sorted(c.size_bytes for c in self.checkpoints)
        durable = (
            f"notice -> emergency checkpoint durable in S3: {self.notice_to_durable_s:.1f} s (of the 120 s notice)"
            if self.notice_to_durable_s is not None
            else "no notice: the node was powered off"
        )
        return [
            f"job {self.job_id}: {'DONE' if self.done else 'NOT DONE'}; "
            f"group desired capacity {self.desired_capacity}; {self.nodes_running_after} node(s) still running",
            f"nodes booted: {self.nodes_booted} (interrupted {self.victim}, replacement {self.replacement})",
            f"steps trained: {self.steps_trained}",
            f"interrupted at step {self.interrupted_at_step}, resumed from step {self.resumed_from_step}: "
            f"{self.steps_redone} step(s) redone",
            durable,
            f"replacement boot -> first training step: {self.replacement_boot_to_first_step_s:.1f} s",
            f"checkpoints in S3: {len(self.checkpoints)} kept, {sizes[0] / 1024:.1f}-{sizes[-1] / 1024:.1f} KiB each"
            if sizes
            else "checkpoints in S3: none",
            f"final test accuracy: {self.final_accuracy:.3f} (world size {self.final_world_size})",
            f"node consoles: {self.log_dir}/<instance-id>/console.log",
        ]


def summarize(run: JobRun) -> Summary:
    """The run's facts, read back from S3, CloudWatch Logs and the Auto Scaling API.

    The single-interruption fields (victim, replacement, interrupted/resumed step) describe the first notice or
    power-off; ``events`` and ``restarts`` cover every one."""
    client, ref, job_id, launcher = run.client, run.ref, run.job_id, run.launcher
    first = next((e for e in run.events if e.kind in INTERRUPTIONS), None)
    if first is None:
        raise EmulatorError("the scenario interrupted no node")
    events = run.log_events()
    durable_at = first_after(events, DURABLE, first.at)[0] if first.kind in WARNED else None
    nodes = launcher.all_nodes()
    replacement = next((n for n in nodes if n.booted_at > first.at), None)
    if replacement is None:
        raise EmulatorError(f"no node booted after the {first.kind} to {first.instance_id}")
    resumed_at, resumed = first_after(events, RESUMED, replacement.booted_at)
    first_step_at, _ = first_after(events, STEP, resumed_at)
    restart = next((r for r in restarts(events) if r.at == resumed_at), None)
    if restart is None:
        raise EmulatorError(f"no restart of the trainer at the 'resumed from step' line of {resumed_at:.3f}")
    accuracies = [m for _, _, msg in events if (m := ACCURACY.search(msg))]
    if not accuracies:
        raise EmulatorError("no 'epoch N done: ... test accuracy' line in the job's logs")
    checkpoints = jobs.checkpoints(client, ref, job_id)
    return Summary(
        job_id=job_id,
        done=jobs.marker(client, ref, job_id, DONE) is not None,
        desired_capacity=jobs.desired_capacity(client, ref),
        nodes_booted=len(nodes),
        nodes_running_after=len(launcher.running()),
        steps_trained=checkpoints[-1].step if checkpoints else 0,
        interrupted_at_step=restart.furthest_before,
        resumed_from_step=int(resumed.group(1)),
        notice_to_durable_s=None if durable_at is None else durable_at - first.at,
        replacement_boot_to_first_step_s=first_step_at - replacement.booted_at,
        checkpoints=checkpoints,
        final_accuracy=float(accuracies[-1].group(3)),
        final_world_size=int(accuracies[-1].group(4)),
        victim=first.instance_id,
        replacement=replacement.instance_id,
        log_dir=launcher.work_dir,
        nodes=nodes,
        events=list(run.events),
        restarts=restarts(events),
    )
