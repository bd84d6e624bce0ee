"""``trainctl``: submit, watch and stop training jobs on a deployed cluster (real AWS or the emulated cloud).

    trainctl submit --team T --cluster C --code DIR [--nodes N] [--command "python train.py ..."] [--resume-from JOB]
    trainctl status --team T --cluster C [JOB]
    trainctl logs   --team T --cluster C JOB [--node INSTANCE] [--follow]
    trainctl stop   --team T --cluster C JOB [--force]
    trainctl list   --team T --cluster C
    trainctl cost   --team T --cluster C [JOB] [--prices FILE]
    trainctl review [--assembly DIR] [--base DIR] [--prices FILE] [--spot-prices FILE] [--out FILE]

The AWS endpoint, region and credentials come from the environment, as for the AWS CLI (``AWS_ENDPOINT_URL``
for the emulator: ``python -m emulator up`` prints the exports). ``--json`` prints machine-readable output.
``review`` needs no AWS access: it synthesizes the app (or reads ``--assembly``) and prints Markdown.
Errors are one line on stderr with exit code 2 (bad input, unknown team/cluster/job) or 3 (AWS unreachable
or no credentials); Ctrl-C exits 130 without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Optional

import boto3
from boto3.exceptions import Boto3Error
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    InvalidRegionError,
    NoCredentialsError,
)

from bootstrap_scripts.spot_training.job_spec import DRAIN_HEARTBEAT_S
from trainctl import cost, jobs, prices, review

EXIT_BAD_INPUT, EXIT_AWS, EXIT_INTERRUPTED = 2, 3, 130
FOLLOW_LIMIT_S = 24 * 3600.0


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(c).upper() for c in columns]] + [
        ["" if r.get(c) is None else str(r[c]) for c in columns] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _bad_endpoint(problem: object) -> CliError:
    return CliError(
        f"AWS_ENDPOINT_URL {os.environ.get('AWS_ENDPOINT_URL')!r}: {problem}; give a URL such as https://host:port"
    )


def _check_endpoint() -> None:
    """AWS_ENDPOINT_URL, when set, as botocore needs it (it fails late, with a traceback, on some bad forms)."""
    url = os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        problem = "" if parts.port is not None or parts.hostname else "no host"  # .port raises on a bad port
        problem = problem or ("" if parts.scheme in ("http", "https") else "not an http(s) URL")
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise _bad_endpoint(problem)


def _client_factory(region: Optional[str]) -> jobs.ClientFactory:
    _check_endpoint()
    session = boto3.session.Session(region_name=region or os.environ.get("AWS_REGION") or None)
    if session.region_name is None:
        raise CliError("no AWS region: set AWS_REGION or pass --region")
    cache: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in cache:
            try:
                cache[service] = session.client(service)
            except InvalidRegionError:
                raise CliError(
                    f"--region / AWS_REGION {session.region_name!r} is not a region; use one such as us-east-1"
                ) from None
            except ValueError as exc:  # botocore: an endpoint URL it cannot use (a host name it refuses)
                raise _bad_endpoint(exc) from None
        return cache[service]

    return client


job_state = jobs.job_state


def current_job(client: jobs.ClientFactory, ref: jobs.ClusterRef) -> str:
    job_id = jobs.current_job_id(client, ref)
    if job_id is None:
        raise CliError(f"no job was ever submitted to {ref.team}/{ref.cluster}")
    return job_id


def known_job(client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str) -> str:
    if not jobs.submitted(client, ref, job_id):
        raise CliError(f"no job {job_id!r} on {ref.team}/{ref.cluster} (see 'trainctl list')")
    return job_id


def status(client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str) -> dict[str, Any]:
    """The job's state and progress; the group's capacity and nodes only for the cluster's current job (``group_job``):
    the group belongs to it, an earlier job has no node."""
    group_job = jobs.current_job_id(client, ref)
    group = jobs.group(client, ref) if group_job == job_id else {"DesiredCapacity": None, "Instances": []}
    members = group["Instances"]
    details = jobs.described(client, [m["InstanceId"] for m in members])
    nodes = [
        {
            "instance": m["InstanceId"],
            "state": m["LifecycleState"],
            "market": "spot" if details.get(m["InstanceId"], {}).get("InstanceLifecycle") == "spot" else "on-demand",
            "az": m.get("AvailabilityZone"),
            "type": m.get("InstanceType") or details.get(m["InstanceId"], {}).get("InstanceType"),
        }
        for m in members
    ]
    checkpoints = jobs.checkpoints(client, ref, job_id)
    last = checkpoints[-1] if checkpoints else None
    budget = jobs.team_budget(client, ref.team)
    state = job_state(client, ref, job_id)
    failed = jobs.marker(client, ref, job_id, "FAILED") if state == "FAILED" else None
    planned = jobs.planned_steps(client, ref, job_id)
    eta_s = None
    if state == "RUNNING" and planned:  # the pace of the current run (no restart between its checkpoints)
        eta_s = jobs.eta_s(checkpoints, planned, jobs.run_starts(client, ref, job_id), time.time())
    return {
        "job_id": job_id,
        "team": ref.team,
        "cluster": ref.cluster,
        "state": state,
        "reason": None if failed is None else str(failed.get("reason") or "(the FAILED marker gives no reason)"),
        "group": ref.group,
        "group_job": group_job,
        "desired_capacity": group["DesiredCapacity"],
        "nodes": nodes,
        # a flat checkpoint (the script's own files) has no step: its number counts the snapshots
        "last_checkpoint_step": last.step if last and last.layout == "step" else None,
        "last_flat_checkpoint": last.step if last and last.layout == "flat" else None,
        "last_checkpoint_age_s": round(time.time() - last.manifest_time, 1) if last else None,
        "planned_steps": planned,
        "eta_s": eta_s,
        "interruptions": jobs.spot_interruptions(client, ref, job_id),
        "budget": asdict(budget) if isinstance(budget, jobs.Budget) else budget,  # None, a dict or BUDGET_UNKNOWN
    }


def format_status(info: dict[str, Any]) -> str:
    shown = dict(info)
    if isinstance(info["budget"], dict):
        b = info["budget"]
        shown["budget"] = f"spent {b['spent_usd']:.2f} of {b['limit_usd']:.2f} USD this month ({b['name']})"
    if info["last_flat_checkpoint"] is None:
        del shown["last_flat_checkpoint"]
    if info["eta_s"] is None and info["state"] == "RUNNING" and info["planned_steps"]:
        shown["eta_s"] = (
            "unknown (flat checkpoints: the agent cannot tell their step)"
            if info["last_flat_checkpoint"] is not None
            else "unknown (fewer than 2 checkpoints since the last node boot, restart or interruption)"
        )
    if info["reason"] is None:
        del shown["reason"]  # only a FAILED job has one
    head = "\n".join(f"{k}: {'-' if v is None else v}" for k, v in shown.items() if k not in ("nodes", "group_job"))
    nodes = table(info["nodes"], ["instance", "state", "market", "az", "type"]) if info["nodes"] else "no nodes"
    if info["group_job"] not in (None, info["job_id"]):
        nodes = f"no nodes: the group belongs to the current job {info['group_job']}"
    return f"{head}\n\n{nodes}"


def list_jobs(client: jobs.ClientFactory, ref: jobs.ClusterRef) -> list[dict[str, Any]]:
    rows = []
    pages = client("s3").get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=ref.code_prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            job_id = obj["Key"][len(ref.code_prefix) :].split(".", 1)[0]
            rows.append({"job_id": job_id, "submitted": obj["LastModified"].strftime("%Y-%m-%d %H:%M:%S")})
    for row in rows:
        row["state"] = job_state(client, ref, row["job_id"])
    return sorted(rows, key=lambda r: r["submitted"])


def stop(client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str, force: bool = False) -> str:
    """Ask the nodes to checkpoint and stop (they write STOPPED and scale to 0). With no node in the group (the
    job waits for capacity), nothing would write STOPPED: write it here and scale to 0. A job that is not the
    current one has no node: nothing to do (the group belongs to the current job). ``force``: also set the group
    to 0 now, for nodes whose agents do not answer (the ones that do save as on a spot notice)."""
    state = job_state(client, ref, job_id)
    if state in jobs.ENDED:
        return f"job {job_id} is already {state}"
    if state == "UNFINISHED":
        return f"job {job_id} is not running (UNFINISHED: no node runs it); nothing to stop"
    s3, prefix = client("s3"), ref.job_prefix(job_id)
    if not jobs.group(client, ref)["Instances"]:
        newest = jobs.checkpoints(client, ref, job_id)
        body = {"by": "trainctl stop", "last_checkpoint": newest[-1].step if newest else None, "time": time.time()}
        s3.put_object(Bucket=ref.bucket, Key=f"{prefix}STOPPED", Body=json.dumps(body).encode())
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
        return f"job {job_id}: no node running; STOPPED, group set to 0"
    asked = jobs.object_time(client, ref, f"{prefix}STOP")
    if asked is None:  # not rewritten: the budget guard times an overdue stop from when S3 stored it
        s3.put_object(Bucket=ref.bucket, Key=f"{prefix}STOP", Body=json.dumps({"requested_at": time.time()}).encode())
    not_made = "" if force else cancel_launches_not_made(client, ref)
    if force:
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
        return (
            f"job {job_id}: group set to 0 now; nodes whose agents answer save a final checkpoint as on a spot notice "
            f"(at most the drain hook's {DRAIN_HEARTBEAT_S:.0f} s), the others are terminated"
        )
    if asked is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(asked))
        return (
            f"job {job_id}: stop already requested at {when}; not asked again (the nodes are saving a final "
            f"checkpoint; if none answers, `trainctl stop --force` sets the group to 0 now){not_made}"
        )
    return f"job {job_id}: stop requested; the nodes save a final checkpoint, then the group goes to 0{not_made}"


def cancel_launches_not_made(client: jobs.ClientFactory, ref: jobs.ClusterRef) -> str:
    """Set a stopping job's group to the nodes it has when it wants more (no spot capacity for them): a node booting
    into a stopping job is billed for nothing, and the nodes that wait for it leave one by one, each lowering the
    count by one only. Read again just before (after the STOP write): an agent may have set 0 or left meanwhile;
    the count is only ever lowered. What was done, for the message ("" if nothing)."""
    members = jobs.group(client, ref)
    live = sum(i["LifecycleState"].startswith(("Pending", "InService")) for i in members["Instances"])
    cancelled = int(members["DesiredCapacity"]) - live
    if cancelled <= 0:
        return ""
    client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=live)
    return f"; {cancelled} launch(es) not made yet cancelled (group set to {live})"


def print_logs(
    client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str, node: Optional[str], follow: bool
) -> None:
    read_to: dict[str, str] = {}  # per stream, its token after the lines printed: each poll reads only new ones
    deadline = time.monotonic() + FOLLOW_LIMIT_S
    last = not follow
    while True:
        streams = jobs.stream_events(client, ref, job_id, read_to)
        if node is not None and not follow and not any(name.endswith("/" + node) for name in streams):
            shipped = ", ".join(sorted(name.split("/", 1)[1] for name in streams)) or "none yet"
            raise CliError(f"no logs of node {node} in job {job_id}; nodes with logs: {shipped}")
        # only the lines not printed yet: one another node ships late is printed when it comes, though lines of a
        # later time were printed before it (sorted by time only: a stream's lines of one time stay in its order)
        new = sorted(
            (
                (ts, name, message)
                for name, lines in streams.items()
                if node is None or name.endswith("/" + node)
                for ts, message in lines
            ),
            key=lambda e: e[0],
        )
        for ts, stream, message in new:
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ts))} {stream.split('/', 1)[1]} {message}")
        if last or time.monotonic() > deadline:
            return
        # ended: one more read for the lines shipped with the end (the agent's last flush comes after its marker)
        last = job_state(client, ref, job_id) in jobs.NOT_RUNNING
        time.sleep(2.0)


def format_cost(info: dict[str, Any]) -> str:
    def money(v: float) -> str:
        return f"{v:.4f}"

    types = [
        dict(r, hours=f"{r['hours']:.3f}", usd_per_hour=money(r["usd_per_hour"]), cost_usd=money(r["cost_usd"]),
             on_demand_usd=money(r["on_demand_usd"]))
        for r in info["by_type"]
    ]  # fmt: skip
    nodes = [dict(n, hours=f"{n['hours']:.3f}", cost_usd=money(n["cost_usd"])) for n in info["nodes"]]
    return "\n".join(
        [
            f"job {info['job_id']}: {len(info['nodes'])} instance(s)",
            "",
            table(types, ["type", "market", "nodes", "hours", "usd_per_hour", "cost_usd", "on_demand_usd"]),
            "",
            table(nodes, ["instance", "type", "market", "az", "hours", "cost_usd", "timed_by"]),
            "",
            f"total: {money(info['total_usd'])} USD; the same hours on demand: {money(info['on_demand_usd'])} USD; "
            f"savings {info['savings_pct']:.1f} %",
            f"interruptions: {info['interruptions']}; {cost.redone_text(info['redone'])}",
            f"on-demand prices: {info['on_demand_prices']}",
            f"spot prices: {info['spot_prices']}",
            *(f"warning: {w}" for w in info["warnings"]),
        ]
    )


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line with where to look (argparse prints the whole usage first).
    Subcommands' parsers are of this class too (argparse makes them of their parent's)."""

    argv: ClassVar[list[str]] = []  # what the top-level parser was given, for the hints below

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        Parser.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        unrecognized = message.split()[2:] if message.startswith("unrecognized arguments:") else []
        misplaced = [option for option in ("--region", "--json") if option in unrecognized]
        hint = _placed(misplaced, "before", f"trainctl {misplaced[0]} ... status ...") if misplaced else ""
        # `trainctl --team T status ...`: argparse takes T for the command
        if message.startswith("argument action: invalid choice:"):
            actions = re.findall(r"'([a-z]+)'", message.partition("choose from")[2])
            command = next((a for a in Parser.argv if a in actions), None)
            before = Parser.argv[: Parser.argv.index(command)] if command else Parser.argv
            early = [option for option in ("--team", "--cluster") if option in before]
            if early:
                hint = _placed(early, "after", f"trainctl {command or 'status'} {early[0]} ...")
        self.exit(2, f"{self.prog}: error: {message}{hint}; see {self.prog} --help\n")


def _placed(options: Sequence[str], where: str, example: str) -> str:
    """The hint for options given on the wrong side of the command."""
    verb = "go" if len(options) > 1 else "goes"
    return f"; {' and '.join(options)} {verb} {where} the command: {example}"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="trainctl", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--region", help="AWS region (default: AWS_REGION / the AWS config)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="action", required=True)

    def cluster_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--team", default="default", help="team (stack TrainingStack[-team]); default 'default'")
        sp.add_argument("--cluster", required=True, help="cluster name from the team file")

    s = sub.add_parser("submit", help="pack and upload code, write the job, scale the group")
    cluster_args(s)
    s.add_argument("--code", type=Path, required=True, help="directory to pack (.gitignore respected)")
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
    s.add_argument("--python", help="interpreter of the training environment on the node")
    s.add_argument("--checkpoint-interval-s", type=float, help="fixed checkpoint interval (default: Young/Daly)")
    s.add_argument(
        "--checkpoint-wait-for-upload",
        action=argparse.BooleanOptionalAction,
        help="train on only once each checkpoint is durable in S3 (default: the cluster's job setting)",
    )
    for name, help_text in (("status", "nodes, checkpoint, interruptions"), ("logs", "the job's logs")):
        sp = sub.add_parser(name, help=help_text)
        cluster_args(sp)
        sp.add_argument("job", nargs="?" if name == "status" else None, help="job id (status: default current job)")
        if name == "logs":
            sp.add_argument("--node", help="only this instance's stream")
            sp.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    sp = sub.add_parser("stop", help="final checkpoint, then scale to 0")
    cluster_args(sp)
    sp.add_argument("job", help="job id")
    sp.add_argument(
        "--force", action="store_true", help="also set the group to 0 now (for nodes whose agents do not answer)"
    )
    cluster_args(sub.add_parser("list", help="jobs submitted to the cluster"))
    sp = sub.add_parser("cost", help="instance-hours, spot vs on-demand cost, work redone after interruptions")
    cluster_args(sp)
    sp.add_argument("job", nargs="?", help="job id (default: the current job)")
    sp.add_argument("--prices", type=Path, help="YAML/JSON {instance_type: on-demand USD per hour} to use")
    sp = sub.add_parser("review", help="Markdown summary of the synthesized app for a pull request (no AWS access)")
    sp.add_argument("--assembly", type=Path, help="a cloud assembly (cdk.out) to read instead of synthesizing")
    sp.add_argument("--teams-dir", type=Path, help="team files to synthesize (default: the repository's teams/)")
    sp.add_argument("--base", type=Path, help="the base branch's cloud assembly: show IAM changes and replacements")
    sp.add_argument("--prices", type=Path, help="YAML/JSON {instance_type: on-demand USD per hour} to use")
    sp.add_argument("--spot-prices", type=Path, help="YAML/JSON {instance_type: spot USD per hour} to use")
    sp.add_argument("--out", type=Path, help="also write the Markdown to this file")
    return p


def run_review(args: argparse.Namespace) -> str:
    if args.out and not args.out.parent.is_dir():  # before a synth of every team, not after
        raise CliError(f"--out {args.out}: folder {args.out.parent} does not exist")
    try:
        table_ = prices.load_prices(args.prices)
        spot = prices.read_price_file(args.spot_prices) if args.spot_prices else None
        if args.assembly is None:  # synthesized into a temporary folder, read, removed (--assembly: kept)
            with tempfile.TemporaryDirectory(prefix="trainctl-review-") as tmp:
                head = review.load_assembly(review.synthesize(Path(tmp), args.teams_dir))
        else:
            head = review.load_assembly(args.assembly)
        base = review.load_assembly(args.base) if args.base else None
        text = review.summary(head, table_, spot, base)
    except (prices.PriceError, review.ReviewError) as exc:
        raise CliError(str(exc)) from None
    if args.out:
        try:
            args.out.write_text(text)
        except OSError as exc:
            raise CliError(f"--out {args.out}: cannot write it ({exc.strerror})") from None
    return text


def run(args: argparse.Namespace) -> int:
    if args.action == "review":
        print(run_review(args), end="")
        return 0
    client = _client_factory(args.region)
    ref = jobs.find_cluster(client, args.team, args.cluster)  # a JobError is one line, exit 2 (main)
    out: Any
    if args.action == "submit":
        given = {
            "python": args.python,
            "checkpoint_interval_s": args.checkpoint_interval_s,
            "checkpoint_wait_for_upload": args.checkpoint_wait_for_upload,
        }
        overrides = {k: v for k, v in given.items() if v is not None}
        command = str(ref.spec["command"]) if args.entry_command is None else args.entry_command  # "" is refused
        job_id = jobs.submit(
            client, ref, args.code, command=command,
            nodes=int(ref.spec["desired_nodes"]) if args.nodes is None else args.nodes,
            job_id=args.job_id, resume_from=args.resume_from, report=lambda line: print(line, file=sys.stderr),
            **overrides,
        )  # fmt: skip
        out = {"job_id": job_id} if args.json else job_id
    elif args.action == "status":
        info = status(client, ref, known_job(client, ref, args.job or current_job(client, ref)))
        out = info if args.json else format_status(info)
    elif args.action == "logs":
        print_logs(client, ref, known_job(client, ref, args.job), args.node, args.follow)
        return 0
    elif args.action == "cost":
        try:
            table_ = prices.load_prices(args.prices)
            info = cost.job_cost(client, ref, known_job(client, ref, args.job or current_job(client, ref)), table_)
        except prices.PriceError as exc:
            raise CliError(str(exc)) from None
        out = info if args.json else format_cost(info)
    elif args.action == "stop":
        message = stop(client, ref, known_job(client, ref, args.job), force=args.force)
        out = {"message": message} if args.json else message
    else:
        rows = list_jobs(client, ref)
        out = rows if args.json else (table(rows, ["job_id", "state", "submitted"]) if rows else "no jobs")
    print(json.dumps(out, indent=1, default=str) if args.json else out)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except CliError as exc:
        print(f"trainctl: error: {exc}", file=sys.stderr)
        return exc.code
    except jobs.JobError as exc:  # a one-line reason (unknown cluster, bad code, a current-job that is not a job)
        print(f"trainctl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C (logs --follow): quietly, as a shell expects of an interrupted command
        return EXIT_INTERRUPTED
    except NoCredentialsError:
        print("trainctl: error: no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID/...)", file=sys.stderr)
        return EXIT_AWS
    except EndpointConnectionError as exc:
        print(f"trainctl: error: the AWS endpoint does not answer: {exc.kwargs.get('endpoint_url')}", file=sys.stderr)
        return EXIT_AWS
    except (ClientError, BotoCoreError, Boto3Error) as exc:
        print(f"trainctl: error: AWS call failed: {exc}", file=sys.stderr)
        return EXIT_AWS
