"""The emulator's AWS endpoint: moto's server app, with the compatibility layer installed first.

Run as ``python -m emulator.server --tls-cert server.pem --tls-key server.key``. It binds an HTTPS
listener (the endpoint) and a plain-HTTP listener (only to show that TLS-only policies deny it),
both on loopback and on ports the kernel picks (so there is no race between choosing a port and
binding it), prints one JSON line ``{"port": N, "insecure_port": M, "pid": P, "seeded": {...}}`` on
stdout and serves until SIGTERM or SIGINT (or until stdin closes, with ``--exit-on-stdin-eof``).

Order matters: :func:`emulator.cfn_compat.install` (and :func:`emulator.ebs_strict.install`,
:func:`emulator.billing.install`) run before
the server handles its first request, because moto builds its CloudFormation type map once, from the
subclasses that exist then.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from werkzeug.serving import BaseWSGIServer

from emulator import billing, cfn_compat, ebs_strict, fis_state, group_updates, http_serving, lifecycle, spot_capacity
from emulator.request_counts import RequestCounts, WsgiApp
from emulator.settings import ACCOUNT_ID, REGION


def _with_transport(app: Any, secure: bool) -> Callable[..., Iterable[bytes]]:
    """WSGI wrapper: tell the compat layer whether this request came over TLS (``aws:SecureTransport``)."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with cfn_compat.request_transport(secure=secure):
            # moto answers synchronously: materialise the body while the context is set.
            return list(app(environ, start_response))

    return wrapped


def serve(
    host: str,
    tls_cert: str,
    tls_key: str,
    public_ami_parameters: list[str],
    *,
    port: int = 0,
    insecure_port: int = 0,
    exit_on_stdin_eof: bool = False,
    iam_enforcement: bool = False,
    requests_file: Optional[str] = None,
    no_spot_capacity: tuple[str, ...] = (),
) -> None:
    """Install the compat layer, seed public parameters, bind, announce the ports, serve until told to stop."""
    # Warnings (moto's "No Moto CloudFormation support", the compat layer's unsupported properties)
    # go to stderr, i.e. the server log that emulator.deploy checks.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    _install(iam_enforcement, no_spot_capacity)
    seeded = cfn_compat.seed_public_ami_parameters(ACCOUNT_ID, REGION, public_ami_parameters)
    counts = None if requests_file is None else RequestCounts(Path(requests_file))
    servers = _bind(
        host,
        port,
        insecure_port,
        tls_cert,
        tls_key,
        _routes(counts),
    )
    stopping = threading.Event()

    def stop(signum: int = 0, frame: Optional[FrameType] = None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if exit_on_stdin_eof:
        # The launcher holds the other end of stdin: EOF means it is gone (even after SIGKILL).
        threading.Thread(target=_stop_on_eof, args=(stop,), daemon=True, name="stdin-watch").start()
    threads = [
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2}, name=f"serve-{s.server_port}")
        for s in servers
    ]
    for t in threads:
        t.start()
    if counts is not None:
        counts.start()
    ports = {"port": servers[0].server_port, "insecure_port": servers[1].server_port}
    print(json.dumps({**ports, "pid": os.getpid(), "seeded": seeded}), flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        for s in servers:
            s.shutdown()
        for t in threads:
            t.join(timeout=10)
        for s in servers:
            s.server_close()
        if counts is not None:
            counts.stop()


def _routes(counts: Optional[RequestCounts]) -> WsgiApp:
    """moto's app with the emulator's own routes: FIS experiment states, spot capacity."""
    return spot_capacity.serving(fis_state.serving(http_serving.moto_app(counts)))


def _install(iam_enforcement: bool, no_spot_capacity: tuple[str, ...] = ()) -> None:
    """What the emulator adds to moto, before the first request; the zones without spot capacity from the start."""
    for option in no_spot_capacity:
        zone, types = spot_capacity.parse_option(option)
        spot_capacity.set_capacity(zone, False, types)
    cfn_compat.install()
    ebs_strict.install()  # EC2's VolumeInUse / ZoneMismatch answers for attach_volume
    billing.install()  # spot launches, scaling activities, spot prices (what trainctl cost reads)
    group_updates.install()  # UpdateAutoScalingGroup keeps the parts of a MixedInstancesPolicy it does not name
    lifecycle.install()  # terminating lifecycle hooks: Terminating:Wait, CompleteLifecycleAction
    fis_state.install()  # FIS experiments in the state the drill runner reports (emulator/fis_drills.py)
    if iam_enforcement:
        # Only prepares moto's IAM checks (resource ARNs of non-S3 actions); they start when the launcher switches
        # enforcement on through /moto-api/reset-auth (EmulatedCloud.enforce_iam), after the deploys.
        from emulator import iam_resources

        iam_resources.install()


def _bind(host: str, port: int, insecure_port: int, tls_cert: str, tls_key: str, app: WsgiApp) -> list[BaseWSGIServer]:
    """The HTTPS listener (the endpoint) and the plain-HTTP one, both serving ``app`` (moto's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls_cert, tls_key)
    return [
        http_serving.make_server(host, port, _with_transport(app, True), ssl_context=context),
        http_serving.make_server(host, insecure_port, _with_transport(app, False)),
    ]


def _stop_on_eof(stop: Callable[[], None]) -> None:
    while sys.stdin.buffer.read(4096):
        pass
    stop()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.server", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="HTTPS port (default 0: any free port)")
    parser.add_argument("--insecure-port", type=int, default=0, help="plain-HTTP port (default 0: any free port)")
    parser.add_argument("--tls-cert", required=True, help="PEM server certificate chain for localhost")
    parser.add_argument("--tls-key", required=True, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--public-ami-parameter",
        action="append",
        default=[],
        metavar="NAME",
        help="public SSM parameter (/aws/service/...) to seed with an AMI id moto knows; repeatable",
    )
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (used by the launcher)"
    )
    parser.add_argument(
        "--iam-enforcement",
        action="store_true",
        help="prepare moto's IAM enforcement (emulator/iam_resources.py); it stays off until switched on",
    )
    parser.add_argument(
        "--requests-file",
        metavar="PATH",
        help="count the requests by service, action and caller into this JSON file (emulator/request_counts.py)",
    )
    parser.add_argument(
        "--no-spot-capacity",
        action="append",
        default=[],
        metavar="ZONE[:TYPE,TYPE]",
        help="the zone has no spot capacity for these types (default: any); repeatable (emulator/spot_capacity.py)",
    )
    args = parser.parse_args(argv)
    if not args.host.startswith("127."):
        parser.error("the emulator only listens on loopback (127.0.0.0/8)")
    serve(
        args.host,
        args.tls_cert,
        args.tls_key,
        args.public_ami_parameter,
        port=args.port,
        insecure_port=args.insecure_port,
        exit_on_stdin_eof=args.exit_on_stdin_eof,
        iam_enforcement=args.iam_enforcement,
        requests_file=args.requests_file,
        no_spot_capacity=tuple(args.no_spot_capacity),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
