"""``trainctl``: submit, watch and stop training jobs on a deployed cluster (real AWS or the emulated cloud).

    trainctl submit [JOB_FILE] --team T --cluster C --code DIR [--nodes N] [--command "python train.py ..."] [...]
    trainctl status --team T --cluster C [JOB]
    trainctl logs   --team T --cluster C JOB [--node INSTANCE] [--follow]
    trainctl stop   --team T --cluster C JOB [--force] [--clear-queue]
    trainctl list   --team T --cluster C
    trainctl queue  --team T --cluster C
    trainctl cancel --team T --cluster C JOB
    trainctl cost   --team T --cluster C [JOB] [--prices FILE]
    trainctl drill  --team T --cluster C [--timeout-s S]
    trainctl review [--assembly DIR] [--base DIR] [--prices FILE] [--spot-prices FILE] [--out FILE]

The AWS endpoint, region and credentials come from the environment, as for the AWS CLI (``AWS_ENDPOINT_URL``
for the emulator: ``python -m emulator up`` prints the exports). ``--json`` prints machine-readable output.
``review`` needs no AWS access: it synthesizes the app (or reads ``--assembly``) and prints Markdown; the
synth needs the ops repository's toolchain (``assembly.load_cdk_app``), the other commands only the package's own
dependencies (pyproject.toml).
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
import urllib.parse
from collections.abc import Callable, Sequence
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

from trainctl import assembly, prices, review
from trainctl.cluster import ClientFactory, ClusterRef, JobError, find_cluster
from trainctl.code_archive import NotInArchive
from trainctl.cost import job_cost
from trainctl.drill import DEFAULT_TIMEOUT_S, drill, format_drill
from trainctl.job_logs import print_logs
from trainctl.job_queue import cancel, queue_after_stop, queue_rows
from trainctl.status import current_job, known_job, list_jobs, status
from trainctl.stop import stop
from trainctl.submit import submit
from trainctl.submit_options import SubmitRequest, add_submit_args, job_keys, submit_request
from trainctl.views import format_cost, format_status, table

EXIT_BAD_INPUT, EXIT_AWS, EXIT_INTERRUPTED = 2, 3, 130


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


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


def _client_factory(region: Optional[str]) -> ClientFactory:
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
    add_submit_args(sub.add_parser("submit", help="pack and upload code, write the job, scale the group"))
    for name, help_text in (("status", "nodes, checkpoint, interruptions"), ("logs", "the job's logs")):
        sp = sub.add_parser(name, help=help_text)
        _cluster_args(sp)
        sp.add_argument("job", nargs="?" if name == "status" else None, help="job id (status: default current job)")
        if name == "logs":
            sp.add_argument("--node", help="only this instance's stream")
            sp.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    sp = sub.add_parser("stop", help="final checkpoint, then scale to 0")
    _cluster_args(sp)
    sp.add_argument("job", help="job id")
    sp.add_argument(
        "--force", action="store_true", help="also set the group to 0 now (for nodes whose agents do not answer)"
    )
    sp.add_argument(
        "--clear-queue",
        action="store_true",
        help="also take every queued job out of the queue (without it, the next queued job starts after the stop)",
    )
    _cluster_args(sub.add_parser("list", help="jobs submitted to the cluster"))
    _cluster_args(sub.add_parser("queue", help="the cluster's queued jobs, the next one first"))
    sp = sub.add_parser("cancel", help="take a queued job out of the queue (a running job: trainctl stop)")
    _cluster_args(sp)
    sp.add_argument("job", help="job id of a queued job")
    sp = sub.add_parser("cost", help="instance-hours, spot vs on-demand cost, work redone after interruptions")
    _cluster_args(sp)
    sp.add_argument("job", nargs="?", help="job id (default: the current job)")
    sp.add_argument("--prices", type=Path, help="YAML/JSON {instance_type: on-demand USD per hour} to use")
    sp = sub.add_parser("drill", help="start the cluster's interruption drill (FIS) on the running job, report")
    _cluster_args(sp)
    sp.add_argument(
        "--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help=f"give up after (default {DEFAULT_TIMEOUT_S:.0f})"
    )
    _review_args(
        sub.add_parser("review", help="Markdown summary of the synthesized app for a pull request (no AWS access)")
    )
    return p


def _cluster_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--team", default="default", help="team (stack TrainingStack[-team]); default 'default'")
    sp.add_argument("--cluster", required=True, help="cluster name from the team file")


def _review_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--assembly", type=Path, help="a cloud assembly (cdk.out) to read instead of synthesizing")
    sp.add_argument("--teams-dir", type=Path, help="team files to synthesize (default: the repository's teams/)")
    sp.add_argument("--base", type=Path, help="the base branch's cloud assembly: show IAM changes and replacements")
    sp.add_argument("--prices", type=Path, help="YAML/JSON {instance_type: on-demand USD per hour} to use")
    sp.add_argument("--spot-prices", type=Path, help="YAML/JSON {instance_type: spot USD per hour} to use")
    sp.add_argument("--out", type=Path, help="also write the Markdown to this file")


def run_review(args: argparse.Namespace) -> str:
    if args.out and not args.out.parent.is_dir():  # before a synth of every team, not after
        raise CliError(f"--out {args.out}: folder {args.out.parent} does not exist")
    try:
        table_ = prices.load_prices(args.prices)
        spot = prices.read_price_file(args.spot_prices) if args.spot_prices else None
        if args.assembly is None:  # synthesized into a temporary folder, read, removed (--assembly: kept)
            with tempfile.TemporaryDirectory(prefix="trainctl-review-") as tmp:
                head = assembly.load_assembly(assembly.synthesize(Path(tmp), args.teams_dir))
        else:
            head = assembly.load_assembly(args.assembly)
        base = assembly.load_assembly(args.base) if args.base else None
        text = review.summary(head, table_, spot, base)
    except (prices.PriceError, assembly.ReviewError) as exc:
        raise CliError(str(exc)) from None
    if args.out:
        try:
            args.out.write_text(text)
        except OSError as exc:
            raise CliError(f"--out {args.out}: cannot write it ({exc.strerror})") from None
    return text


def _submit(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    request: SubmitRequest = args.request
    keys = job_keys(request, ref)
    command = str(keys.pop("command", ref.spec["command"]))  # "" is refused
    nodes = int(keys.pop("nodes", ref.spec["desired_nodes"]))
    try:
        job_id = submit(
            client, ref, request.code, command=command, nodes=nodes,
            report=lambda line: print(line, file=sys.stderr), **keys,
        )  # fmt: skip
    except NotInArchive as exc:  # a script the job file names: the file is where to fix it
        from_file = request.loaded is not None and exc.key not in request.options
        raise JobError(f"{request.job_file}: {exc}" if from_file else str(exc)) from None
    return {"job_id": job_id} if args.json else job_id


def _status(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    info = status(client, ref, known_job(client, ref, args.job or current_job(client, ref)))
    return info if args.json else format_status(info)


def _logs(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> None:
    print_logs(client, ref, known_job(client, ref, args.job), args.node, args.follow)


def _cost(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    try:
        table_ = prices.load_prices(args.prices)
        info = job_cost(client, ref, known_job(client, ref, args.job or current_job(client, ref)), table_)
    except prices.PriceError as exc:
        raise CliError(str(exc)) from None
    return info if args.json else format_cost(info)


def _stop(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    message = stop(client, ref, known_job(client, ref, args.job), force=args.force)
    queue = queue_after_stop(client, ref, clear_queue=args.clear_queue)
    message += f"\n{queue}" if queue else ""
    return {"message": message} if args.json else message


def _queue(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    rows = queue_rows(client, ref)
    if args.json:
        return rows
    return table(rows, ["position", "job_id", "nodes", "submitted"]) if rows else f"no job queued on {ref.cluster}"


def _cancel(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    message = cancel(client, ref, args.job)
    return {"message": message} if args.json else message


def _drill(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    report = drill(client, ref, timeout_s=args.timeout_s, progress=lambda line: print(line, file=sys.stderr))
    return report if args.json else format_drill(report)


def _list(args: argparse.Namespace, client: ClientFactory, ref: ClusterRef) -> Any:
    rows = list_jobs(client, ref)
    return rows if args.json else (table(rows, ["job_id", "state", "submitted"]) if rows else "no jobs")


# The commands on a cluster: each returns what to print (None: it printed its own output).
COMMANDS: dict[str, Callable[[argparse.Namespace, ClientFactory, ClusterRef], Any]] = {
    "submit": _submit,
    "status": _status,
    "logs": _logs,
    "cost": _cost,
    "stop": _stop,
    "list": _list,
    "queue": _queue,
    "cancel": _cancel,
    "drill": _drill,
}


def run(args: argparse.Namespace) -> int:
    if args.action == "review":
        print(run_review(args), end="")
        return 0
    if args.action == "submit":  # the job file may name the team and cluster: read before anything else
        args.request = submit_request(args)
        args.team, args.cluster = args.request.team, args.request.cluster
    client = _client_factory(args.region)
    ref = find_cluster(client, args.team, args.cluster)  # a JobError is one line, exit 2 (main)
    out = COMMANDS[args.action](args, client, ref)
    if out is not None:
        print(json.dumps(out, indent=1, default=str) if args.json else out)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except CliError as exc:
        print(f"trainctl: error: {exc}", file=sys.stderr)
        return exc.code
    except JobError as exc:  # a one-line reason (unknown cluster, bad code, a current-job that is not a job)
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
