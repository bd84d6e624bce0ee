"""``python -m emulator up``: start the emulated cloud, bootstrap, deploy, print what clients need, wait for Ctrl-C.

While it waits, every instance an Auto Scaling group launches boots as a local node (``emulator.nodes``), so a
job submitted with ``trainctl submit`` runs. ``python -m emulator demo``: see ``emulator.demo``.

    python -m emulator up [--stack TrainingStack ...] [--run-dir DIR] [--drill-time-scale S]
    python -m emulator interrupt|rebalance|end|power-off (INSTANCE | --any GROUP) --run-dir DIR

The second form delivers a fault to a node of the ``emulator up`` running with that run directory, through its
control endpoint (``emulator.control``). FIS experiments started against the emulated cloud run as drills
(``emulator.fis_drills``); ``--drill-time-scale`` shortens their times.

Prints the endpoint, the environment a client needs (``export`` lines) and the stack outputs, then
keeps the emulator running until Ctrl-C or SIGTERM, and stops it (no process or port left behind).
The run directory (server log, CDK log, cloud assembly, TLS files) is kept and its path printed.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from emulator.cloud import REPO_ROOT, EmulatedCloud, EmulatorError
from emulator.control import FAULTS, ControlServer, send_fault
from emulator.deploy import bootstrap, deploy
from trainctl.jobs import JobError

if TYPE_CHECKING:
    from emulator.nodes import NodeLauncher

_SHOWN_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_CA_BUNDLE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_EC2_METADATA_DISABLED",
)


def up(
    stacks: list[str],
    run_dir: Path,
    *,
    wait: bool = True,
    drill_time_scale: float = 1.0,
    no_spot_capacity: tuple[str, ...] = (),
) -> int:
    print(f"Run directory (logs): {run_dir}", flush=True)
    with EmulatedCloud(run_dir=run_dir, no_spot_capacity=no_spot_capacity) as cloud:
        print(f"Emulated AWS endpoint: {cloud.endpoint_url}  (account {cloud.account_id}, {cloud.region})", flush=True)
        started = time.monotonic()
        took = bootstrap(cloud)
        print(f"cdk bootstrap: {took:.1f} s", flush=True)
        started = time.monotonic()
        outputs = deploy(cloud, *stacks)
        print(f"cdk deploy {' '.join(stacks)}: {time.monotonic() - started:.1f} s", flush=True)
        print("\nStack outputs:")
        for key, value in sorted(outputs.items()):
            print(f"  {key} = {value}")
        env = cloud.client_env()
        print("\nClient environment:")
        for key in _SHOWN_ENV:
            print(f"  export {key}={shlex.quote(env[key])}")
        if wait:
            with running_nodes(cloud, run_dir, drill_time_scale=drill_time_scale):
                print("\nRunning; instances boot as local nodes; press Ctrl-C to stop.", flush=True)
                print(f"Faults: python -m emulator interrupt|rebalance|end|power-off INSTANCE --run-dir {run_dir}")
                while cloud.running:  # until KeyboardInterrupt / SystemExit (SIGTERM, SIGHUP), or the server ends
                    time.sleep(1)
            raise EmulatorError(f"the emulated AWS endpoint exited; see {cloud.server_log}")
    return 0


@contextlib.contextmanager
def running_nodes(
    cloud: EmulatedCloud,
    run_dir: Path,
    *,
    drill_time_scale: float = 1.0,
    on_event: Callable[[str], None] = lambda m: print(m, flush=True),
) -> Iterator[NodeLauncher]:
    """What ``emulator up`` runs while it waits: every instance the groups launch (e.g. after ``trainctl submit``)
    boots as a local node, as in the demo; faults come through the control endpoint (``python -m emulator interrupt
    ...``, :mod:`emulator.control`); FIS experiments run as drills (:mod:`emulator.fis_drills`)."""
    from emulator.demo import NODE_ENV
    from emulator.fis_drills import DrillRunner
    from emulator.nodes import NodeLauncher

    with (
        NodeLauncher(cloud, run_dir / "nodes", node_env=NODE_ENV, on_event=on_event) as launcher,
        ControlServer(launcher, run_dir),
        DrillRunner(cloud, launcher, time_scale=drill_time_scale, on_event=on_event),
    ):
        yield launcher


def at_least(kind: Callable[[str], float], minimum: float) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` (int or float) no lower than ``minimum``."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{' whole' if kind is int else ''} number") from None
        if not value >= minimum:  # NaN too
            raise argparse.ArgumentTypeError(f"{text} is below {minimum:g}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m emulator", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start, bootstrap, deploy, wait for Ctrl-C")
    p_up.add_argument("--stack", action="append", help="stack to deploy (repeatable; default TrainingStack)")
    p_up.add_argument("--run-dir", type=Path, help="directory for logs and TLS files (default: a new temp dir)")
    p_up.add_argument("--no-wait", action="store_true", help="stop right after deploying (for scripts)")
    p_up.add_argument(
        "--drill-time-scale",
        type=at_least(float, 0.001),
        default=1.0,
        help="FIS drills run this much faster or slower (0.05: a 2-minute notice lasts 6 s; default 1)",
    )
    p_up.add_argument(
        "--no-spot-capacity",
        action="append",
        default=[],
        metavar="ZONE[:TYPE,TYPE]",
        help="the zone has no spot capacity for these instance types (default: any); spot launches there fail as "
        "InsufficientInstanceCapacity in the group's scaling activities; repeatable",
    )
    for fault, what in FAULTS.items():
        p_fault = sub.add_parser(fault, help=f"deliver to a node of a running `emulator up`: {what}")
        p_fault.add_argument("instance", nargs="?", help="the instance id")
        p_fault.add_argument("--any", metavar="GROUP", help="instead of an instance: one running node of this group")
        p_fault.add_argument("--run-dir", type=Path, required=True, help="the run directory of `emulator up`")
    p_demo = sub.add_parser("demo", help="deploy, run the example job through a spot interruption, print a summary")
    p_demo.add_argument("--run-dir", type=Path, help="directory for all logs (default: demo-output/run-<time>)")
    p_demo.add_argument(  # the demo interrupts a node after a checkpoint of step 40; an epoch is 21 steps
        "--epochs", type=at_least(int, 3), default=8, help="epochs of the example job (default 8, at least 3)"
    )
    p_demo.add_argument(
        "--step-sleep-s", type=at_least(float, 0), default=0.15, help="slow each step down (default 0.15)"
    )
    p_demo.add_argument(  # the node agent's own lower bound
        "--checkpoint-interval-s", type=at_least(float, 1), default=5.0, help="checkpoint interval (default 5, >= 1)"
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in FAULTS and (args.instance is None) == (args.any is None):
        parser.error(f"{args.command}: give an instance id or --any GROUP (one of them)")
    # Ctrl-C must stop us even when started from a shell that made background jobs ignore SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if args.command == "demo":
            from emulator import demo

            if args.run_dir is None:  # a new one even for two demos started in the same second
                (REPO_ROOT / "demo-output").mkdir(exist_ok=True)
                run_dir = Path(
                    tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%d-%H%M%S-"), dir=REPO_ROOT / "demo-output")
                )
            else:
                run_dir = args.run_dir
            demo.run(
                run_dir,
                epochs=args.epochs,
                step_sleep_s=args.step_sleep_s,
                checkpoint_interval_s=args.checkpoint_interval_s,
            )
            return 0
        if args.command in FAULTS:
            print(send_fault(args.run_dir, args.command, instance=args.instance, group=args.any))
            return 0
        run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="spot-training-emulator-"))
        return up(
            args.stack or ["TrainingStack"],
            run_dir,
            wait=not args.no_wait,
            drill_time_scale=args.drill_time_scale,
            no_spot_capacity=tuple(args.no_spot_capacity),
        )
    except KeyboardInterrupt:
        print("\nStopped.", file=sys.stderr)
        return 130
    except (EmulatorError, JobError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a run directory that cannot be written, ...
        print(f"error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError, ResponseParserError) as e:  # an AWS API call failed: one line, no traceback
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
