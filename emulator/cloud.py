"""``EmulatedCloud``: start the emulator's AWS endpoint (moto + compat layer) and always stop it again.

    with EmulatedCloud(run_dir=Path("emulator-run")) as cloud:
        boto3.client("ec2", **cloud.boto3_kwargs()).describe_vpcs()
        subprocess.run([...], env=cloud.client_env())

The server runs as a child process (``python -m emulator.server``) rather than a thread, so that
moto's global state never mixes with a test process that uses ``moto.mock_aws`` itself, and so that
stopping it is a matter of ending one process. It is stopped when the ``with`` block ends, however
it ends: normally, by an exception, by Ctrl-C (KeyboardInterrupt) or by SIGTERM (turned into
``SystemExit`` while the block runs in the main thread). If this process dies without unwinding
(SIGKILL), the server notices that its stdin pipe closed and stops by itself.

Later, a node launcher can hook in here: it needs only ``endpoint_url`` and ``boto3_kwargs()``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Optional, Union

from emulator.settings import ACCESS_KEY_ID, ACCOUNT_ID, REGION, SECRET_ACCESS_KEY
from emulator.tls import TlsFiles, make_tls_files
from team_config.model import DEFAULT_AMI_PARAMETER

REPO_ROOT = Path(__file__).resolve().parent.parent
# Public SSM parameters the templates resolve at deploy time (AMI ids); see cfn_compat item 5.
DEFAULT_PUBLIC_AMI_PARAMETERS = tuple(DEFAULT_AMI_PARAMETER.values())
START_TIMEOUT_S = 60.0
NO_DOCKER = {"lambda": {"use_docker": False}, "batch": {"use_docker": False}}  # moto's /moto-api/config
STOP_TIMEOUT_S = 10.0
SERVER_PID_FILE = "moto-server.pid"  # in the run directory: a second emulator there is refused while it runs
REQUESTS_FILE = "requests.json"  # in the run directory: the requests answered, by service, action and caller

SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class EmulatorError(RuntimeError):
    """The emulator could not start, or a step against it failed."""


def client_env(
    endpoint_url: str,
    ca_bundle: Path,
    base: Optional[dict[str, str]] = None,
    credentials: tuple[str, str] = (ACCESS_KEY_ID, SECRET_ACCESS_KEY),
) -> dict[str, str]:
    """Environment for any AWS client (CDK CLI, AWS CLI, boto3) that must talk to the emulator only.

    Static credentials (default: the emulator's fake ones); no profile, config file or instance metadata
    lookups (those could reach a real account or 169.254.169.254); a fixed region; the run's CA for TLS.
    """
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith("AWS_") and key not in ("AWS_EC2_METADATA_DISABLED",):
            del env[key]
    env.update(
        {
            "AWS_ENDPOINT_URL": endpoint_url,
            "AWS_ACCESS_KEY_ID": credentials[0],
            "AWS_SECRET_ACCESS_KEY": credentials[1],
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CA_BUNDLE": str(ca_bundle),
            "NODE_EXTRA_CA_CERTS": str(ca_bundle),
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "CDK_DEFAULT_ACCOUNT": ACCOUNT_ID,
            "CDK_DEFAULT_REGION": REGION,
        }
    )
    return env


class EmulatedCloud:
    """The emulated AWS endpoint, as a context manager. See the module docstring."""

    def __init__(
        self,
        *,
        run_dir: Optional[Path] = None,
        host: str = "127.0.0.1",
        public_ami_parameters: tuple[str, ...] = DEFAULT_PUBLIC_AMI_PARAMETERS,
        iam_enforcement: bool = False,
        no_spot_capacity: tuple[str, ...] = (),
    ) -> None:
        """``run_dir`` keeps the server log and the run's TLS files; default: a temporary directory removed on stop.

        ``iam_enforcement``: let :meth:`enforce_iam` switch on moto's evaluation of identity policies (off by
        default, and off at start even when allowed: deploys and most tests use fake root credentials that IAM
        does not know). See emulator/iam_resources.py for what moto then checks and what it does not.
        """
        if not host.startswith("127."):
            raise ValueError("the emulator only listens on loopback (127.0.0.0/8)")
        self.host = host
        # absolute: the server, the CDK CLI and the nodes run in other working directories
        self._given_run_dir = None if run_dir is None else run_dir.resolve()
        self.run_dir: Optional[Path] = None
        self.public_ami_parameters = public_ami_parameters
        self.iam_enforcement = iam_enforcement
        self.no_spot_capacity = no_spot_capacity  # ZONE or ZONE:TYPE,TYPE (emulator/spot_capacity.py)
        self.port: Optional[int] = None
        self.insecure_port: Optional[int] = None
        self.pid: Optional[int] = None
        self.tls: Optional[TlsFiles] = None
        self.seeded_parameters: dict[str, str] = {}
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Any = None
        self._temp_dir: Optional[tempfile.TemporaryDirectory[str]] = None
        self._previous_handlers: dict[int, SignalHandler] = {}
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, bool], Any] = {}
        self._credentials = (ACCESS_KEY_ID, SECRET_ACCESS_KEY)
        self.admin_user: Optional[str] = None

    # -- addresses ---------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """``https://localhost:PORT``: moto reads bucket names out of template URLs by host name."""
        if self.port is None:
            raise EmulatorError("the emulator is not running")
        return f"https://localhost:{self.port}"

    @property
    def insecure_endpoint_url(self) -> str:
        """Plain HTTP to the same emulated cloud; only useful to show that TLS-only policies deny it."""
        if self.insecure_port is None:
            raise EmulatorError("the emulator is not running")
        return f"http://localhost:{self.insecure_port}"

    @property
    def ca_bundle(self) -> Path:
        if self.tls is None:
            raise EmulatorError("the emulator is not running")
        return self.tls.ca_cert

    @property
    def requests_file(self) -> Path:
        """``requests.json``: the requests the endpoint answered (``emulator/request_counts.py``)."""
        if self.run_dir is None:
            raise EmulatorError("the emulator is not running")
        return self.run_dir / REQUESTS_FILE

    @property
    def server_log(self) -> Path:
        if self.run_dir is None:
            raise EmulatorError("the emulator is not running")
        return self.run_dir / "moto-server.log"

    @property
    def account_id(self) -> str:
        return ACCOUNT_ID

    @property
    def region(self) -> str:
        return REGION

    def client_env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        return client_env(self.endpoint_url, self.ca_bundle, base, self._credentials)

    def boto3_kwargs(self, *, insecure: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``boto3.client(service, **kwargs)`` aimed at the emulator."""
        return {
            "endpoint_url": self.insecure_endpoint_url if insecure else self.endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": self._credentials[0],
            "aws_secret_access_key": self._credentials[1],
            "verify": str(self.ca_bundle),
        }

    def client(self, service: str, *, insecure: bool = False) -> Any:
        """A boto3 client for ``service`` aimed at the emulator; one per service, reused (clients are thread-safe)."""
        import boto3

        key = (service, insecure)
        if key not in self._clients:
            self._clients[key] = boto3.session.Session().client(service, **self.boto3_kwargs(insecure=insecure))
        return self._clients[key]

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> EmulatedCloud:
        with self._lock:
            if self._proc is not None:
                raise EmulatorError("the emulator is already running")
            if self._given_run_dir is not None:
                self.run_dir = self._given_run_dir
                self.run_dir.mkdir(parents=True, exist_ok=True)
                _refuse_if_in_use(self.run_dir)  # its TLS files would be replaced under the running one
            else:
                self._temp_dir = tempfile.TemporaryDirectory(prefix="emulator-")
                self.run_dir = Path(self._temp_dir.name)
            self.tls = make_tls_files(self.run_dir / "tls")
            cmd = [
                sys.executable, "-m", "emulator.server", "--host", self.host, "--exit-on-stdin-eof",
                "--tls-cert", str(self.tls.server_cert), "--tls-key", str(self.tls.server_key),
                "--requests-file", str(self.run_dir / REQUESTS_FILE),
            ]  # fmt: skip
            for name in self.public_ami_parameters:
                cmd += ["--public-ami-parameter", name]
            if self.iam_enforcement:
                cmd.append("--iam-enforcement")
            for option in self.no_spot_capacity:
                cmd += ["--no-spot-capacity", option]
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
            self._log = open(self.server_log, "ab")
            self._proc = subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
                cmd,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,  # closed by us (or by the kernel when we die): the server then stops
                stdout=subprocess.PIPE,
                stderr=self._log,
                start_new_session=True,  # Ctrl-C reaches us; we stop the server in order
            )
            (self.run_dir / SERVER_PID_FILE).write_text(f"{self._proc.pid}\n")
        try:
            info = self._read_announcement(self._proc)
        except BaseException:
            self.stop()
            raise
        self.port = int(info["port"])
        self.insecure_port = int(info["insecure_port"])
        self.pid = int(info["pid"])
        self.seeded_parameters = dict(info.get("seeded", {}))
        try:
            # Before any Lambda function exists (moto keeps them in another backend without Docker): moto's
            # default would run an invoked function (or a Batch job) in Docker, pulling images from the internet.
            answer = self._moto_api("config", json.dumps(NO_DOCKER).encode(), "application/json")
            if any(answer.get(service, {}).get("use_docker", True) for service in NO_DOCKER):
                raise EmulatorError(f"moto did not switch Docker off: {answer}")
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _read_announcement(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EmulatorError(f"the emulator did not start within {START_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise EmulatorError(f"the emulator exited during start (exit code {proc.poll()}); see its log")
                line += chunk
            elif proc.poll() is not None:
                raise EmulatorError(f"the emulator exited during start (exit code {proc.returncode}); see its log")
        return dict(json.loads(line.decode().splitlines()[0]))

    def stop(self) -> None:
        """Stop the server and wait for it: SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``. Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and self.run_dir is not None:
                (self.run_dir / SERVER_PID_FILE).unlink(missing_ok=True)
            if proc is not None:
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        stream.close()
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=STOP_TIMEOUT_S)
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._temp_dir is not None:
                self._temp_dir.cleanup()
                self._temp_dir = None
            self.port = self.insecure_port = None
            self._clients.clear()  # a restarted emulator has another port
            self._credentials, self.admin_user = (ACCESS_KEY_ID, SECRET_ACCESS_KEY), None  # and no IAM users

    def enforce_iam(self, on: bool = True) -> None:
        """Switch moto's IAM enforcement on (every request is then checked against its caller's identity
        policies) or off again. Needs ``EmulatedCloud(iam_enforcement=True)``.

        While it is on, only credentials moto's IAM knows work: an IAM user's access key, or credentials from
        ``sts:AssumeRole`` (get them while enforcement is off: the emulator's own fake key is no IAM user).
        """
        if not self.iam_enforcement:
            raise EmulatorError("start the emulator with EmulatedCloud(iam_enforcement=True) to enforce IAM")
        # moto's own switch: the number of requests to let through before checking; 0 = from now on.
        # A form content type would leave moto an empty body.
        answer = self._moto_api("reset-auth", b"0" if on else b"inf", "text/plain")
        if answer.get("status") != "ok":
            raise EmulatorError(f"moto did not switch IAM enforcement {'on' if on else 'off'}: {answer}")

    def use_admin_user(self, name: str = "emulator-admin") -> None:
        """Create an IAM user allowed every action on every resource and use its access key from now on
        (:meth:`client`, :meth:`boto3_kwargs`, :meth:`client_env`): the harness's own calls (polling groups,
        terminating instances, reading S3, assuming roles for nodes) then keep working while :meth:`enforce_iam`
        is on, and only the calls made with other credentials (the nodes' instance roles) are limited.

        Needs ``EmulatedCloud(iam_enforcement=True)``; call it while enforcement is off (the emulator's own fake
        key, which creates the user, is no IAM user). Clients made before keep the fake key: make them after.
        """
        if not self.iam_enforcement:
            raise EmulatorError("an admin user is for EmulatedCloud(iam_enforcement=True) only")
        iam = self.client("iam")
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=name, PolicyName="AllowEverything", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        with self._lock:
            self._credentials = (key["AccessKeyId"], key["SecretAccessKey"])
            self._clients.clear()
            self.admin_user = name

    def set_spot_capacity(self, zone: str, available: bool, instance_types: Optional[list[str]] = None) -> list[str]:
        """Switch spot capacity in ``zone`` off or back on for ``instance_types`` (None: every type); the types the zone
        then has none for (``*``: all). See emulator/spot_capacity.py."""
        body = json.dumps({"zone": zone, "available": available, "instance_types": instance_types}).encode()
        return list(self._post("/_emulator/spot-capacity", body, "application/json")["without_spot_capacity"])

    def _moto_api(self, path: str, body: bytes, content_type: str) -> dict[str, Any]:
        """POST ``body`` to moto's ``/moto-api/<path>``; its JSON answer."""
        return self._post(f"/moto-api/{path}", body, content_type)

    def _post(self, path: str, body: bytes, content_type: str) -> dict[str, Any]:
        """POST ``body`` to the endpoint's ``path``; its JSON answer."""
        import ssl
        import urllib.request

        request = urllib.request.Request(  # noqa: S310 (our loopback endpoint, https)
            f"{self.endpoint_url}{path}", data=body, method="POST", headers={"Content-Type": content_type}
        )
        context = ssl.create_default_context(cafile=str(self.ca_bundle))
        with urllib.request.urlopen(request, context=context, timeout=30) as response:  # noqa: S310
            return dict(json.loads(response.read().decode()))

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmulatedCloud:
        if threading.current_thread() is threading.main_thread():  # a closed terminal (SIGHUP) too: stop, not orphan
            for signum in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    self._previous_handlers[signum] = signal.signal(signum, _raise_system_exit)
        try:
            return self.start()
        except BaseException:
            self._restore_signals()
            raise

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            self.stop()
        finally:
            self._restore_signals()

    def _restore_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)
            self._previous_handlers.clear()


def _refuse_if_in_use(run_dir: Path) -> None:
    """EmulatorError if the server of another emulator with this run directory still runs."""
    try:
        pid = int((run_dir / SERVER_PID_FILE).read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):  # none written, not a pid, or that process ended
        return
    if b"emulator.server" not in command:  # the pid is another process's now (or a zombie's: empty)
        return
    raise EmulatorError(
        f"{run_dir} is the run directory of an emulator that is still running (server pid {pid}); give another one"
    )


def _raise_system_exit(signum: int, frame: Optional[FrameType]) -> None:
    raise SystemExit(128 + signum)
