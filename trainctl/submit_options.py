"""``trainctl submit``'s options and the job file they override: which cluster, which code, and the job the node
agent reads (command, nodes, settings, setup, env, secrets, inputs)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trainctl.cluster import ClusterRef, JobError
from trainctl.job_file import JobFile, check_against_cluster, code_dir, job_values, load_job_file

DEFAULT_TEAM = "default"
# Job settings with an option of their own: --name-with-dashes, of the job file's type for the key.
SETTING_OPTIONS = {
    "python": str,
    "nproc_per_node": int,
    "min_nodes": int,
    "max_nodes": int,
    "checkpoint_interval_s": float,
    "mean_time_between_interruptions_s": float,
    "max_restarts": int,
    "interruption_grace_s": float,
    "stall_timeout_s": int,
}
# NAME=VALUE options, each given once per entry: the job file's key each adds to.
PAIR_OPTIONS = {"env": "env", "secret": "secrets"}


def add_submit_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("job_file", nargs="?", type=Path, help="job file (YAML); the options override its keys")
    s.add_argument("--team", help=f"team (stack TrainingStack[-team]); default: the job file's, else '{DEFAULT_TEAM}'")
    s.add_argument("--cluster", help="cluster name from the team file (or cluster: in the job file)")
    s.add_argument("--code", type=Path, help="directory to pack (.gitignore respected); default: the job file's code")
    s.add_argument("--nodes", type=int, help="number of nodes (default: the cluster's desired_nodes)")
    s.add_argument("--command", dest="entry_command", help="entry command (default: the cluster's job.command)")
    s.add_argument("--job-id", help="job id (default: job-<time>-<random>)")
    s.add_argument(
        "--resume-from",
        metavar="JOB",
        help="start from the newest intact checkpoint of this earlier job of the cluster (none of its nodes left in "
        "the group; if it is the current job: DONE, FAILED, STOPPED or the group at 0); its newest 2 intact "
        "checkpoints are copied under the new job",
    )
    s.add_argument("--setup", help="script in the code directory run with bash on each node before the trainer")
    s.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment variable of the trainer")
    s.add_argument(
        "--secret",
        action="append",
        metavar="NAME=SOURCE",
        help="variable from ssm:<parameter> or secretsmanager:<name>",
    )
    s.add_argument("--input", action="append", metavar="S3_URL=PATH", help="S3 data downloaded to PATH on each node")
    for key, kind in SETTING_OPTIONS.items():
        option = f"--{key.replace('_', '-')}"
        described = (JobFile.model_fields[key].description or "").replace(f" ({option})", "").rstrip(".")
        s.add_argument(option, type=kind, help=described[:1].lower() + described[1:])
    s.add_argument(
        "--checkpoint-wait-for-upload",
        action=argparse.BooleanOptionalAction,
        help="train on only once each checkpoint is durable in S3 (default: the cluster's job setting)",
    )


@dataclass(frozen=True)
class SubmitRequest:
    """What ``trainctl submit`` runs: the job file (if any) and the options, merged; the options win."""

    team: str
    cluster: str
    code: Path
    job_file: Optional[Path]
    loaded: Optional[JobFile]
    options: dict[str, Any]  # the job keys the options set


def submit_request(args: argparse.Namespace) -> SubmitRequest:
    """The job file read (a mistake in it: one line naming it) and the options; a :class:`JobError` when neither
    names the cluster or the code."""
    loaded = load_job_file(args.job_file) if args.job_file is not None else None
    cluster = args.cluster or (loaded.cluster if loaded else None)
    if cluster is None:
        raise JobError("no cluster: give --cluster or cluster: in the job file")
    if args.code is not None:
        code = args.code
    elif loaded is not None and args.job_file is not None:
        code = code_dir(args.job_file, loaded)
    else:
        raise JobError("no code: give --code DIR or a job file (its code: key, or its own directory)")
    team = args.team or (loaded.team if loaded else None) or DEFAULT_TEAM
    return SubmitRequest(team, cluster, code, args.job_file, loaded, _option_values(args))


def _option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The job keys the options give (none given: not in the dict)."""
    given: dict[str, Any] = {key: getattr(args, key) for key in SETTING_OPTIONS}
    given |= {
        "command": args.entry_command,
        "nodes": args.nodes,
        "job_id": args.job_id,
        "resume_from": args.resume_from,
        "setup": args.setup,
        "checkpoint_wait_for_upload": args.checkpoint_wait_for_upload,
    }
    for option, key in PAIR_OPTIONS.items():
        pairs = getattr(args, option)
        if pairs:
            given[key] = dict(_pair(f"--{option}", pair, "NAME") for pair in pairs)
    if args.input:
        given["inputs"] = [dict(zip(("s3", "path"), _pair("--input", i, "S3_URL"), strict=True)) for i in args.input]
    return {key: value for key, value in given.items() if value is not None}


def _pair(option: str, text: str, first: str) -> tuple[str, str]:
    name, sep, value = text.rpartition("=") if option == "--input" else text.partition("=")
    if not sep or not name:
        raise JobError(f"{option} {text!r}: write {first}={'PATH' if option == '--input' else 'VALUE'}")
    return name, value


def job_keys(request: SubmitRequest, ref: ClusterRef) -> dict[str, Any]:
    """The job's keys: the job file's (what the options leave of them checked on the cluster first: a mistake names
    the file), then the options'; ``env`` and ``secrets`` of both merged by name, an option's value winning."""
    keys: dict[str, Any] = {}
    if request.loaded is not None and request.job_file is not None:
        keys = job_values(request.loaded)
        if request.loaded.resume_from is not None:
            keys["resume_from"] = request.loaded.resume_from
        kept = {key: value for key, value in keys.items() if key not in request.options or key in PAIR_OPTIONS.values()}
        for key in PAIR_OPTIONS.values():
            if key in kept:
                kept[key] = {n: v for n, v in kept[key].items() if n not in request.options.get(key, {})}
        check_against_cluster(request.job_file, {k: v for k, v in kept.items() if k != "resume_from"}, ref)
    for key, value in request.options.items():
        keys[key] = {**keys.get(key, {}), **value} if key in PAIR_OPTIONS.values() else value
    return keys
