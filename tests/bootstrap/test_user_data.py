"""``user_data.sh`` before the node agent: reading the instance identity from IMDSv2."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from emulator.imds import ImdsMock

from .conftest import BOOTSTRAP, REGION, TEAM, free_port, loopback
from .test_reboot_hook import FAKE_PYTHON


def test_metadata_that_refuses_connections_at_first_is_waited_for(tmp_path: Path) -> None:
    """A metadata service not answering yet in the first seconds of the boot is tried again (for up to 2 minutes):
    giving up would end the user data before the instance id is known, so nothing could hand the instance back and
    it would stay up, billed, with no agent."""
    fake = tmp_path / "python-fake"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    host = loopback(250)
    port = free_port(host)  # nothing listens there yet: connections are refused
    imds = ImdsMock(host=host, port=port, instance_id="i-0123456789abcdef0")
    env = {
        **os.environ,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{host}:{port}",
        "SPOT_TRAINING_AGENT_PYTHON": str(fake),
        "SPOT_TRAINING_PER_BOOT_DIR": str(tmp_path / "per-boot"),
        "SPOT_TRAINING_WORK_DIR": str(tmp_path / "work"),  # hand-back.sh goes here, not the host's /opt
    }
    args = ["--region", REGION, "--team", TEAM, "--cluster", "c1", "--job-spec-parameter", "/p"]
    later = threading.Timer(2.0, imds.start)  # the metadata service comes up 2 s into the boot
    later.start()
    try:
        booted = subprocess.run(
            ["bash", str(BOOTSTRAP / "user_data.sh"), *args], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        later.cancel()
        later.join()
        imds.stop()  # nothing to stop if it never started
    assert booted.returncode == 0, booted.stderr
    assert "no IMDSv2 token" not in booted.stderr
    assert f"instance=i-0123456789abcdef0 region={REGION} az=us-east-1a" in booted.stderr
    assert "PUT /latest/api/token" in imds.requests
