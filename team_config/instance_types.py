"""The EC2 instance types a team file may name: botocore's list for the pinned version, kept in a text file.

Read from ``ec2_instance_types.txt`` (a few milliseconds) instead of botocore's EC2 model at every synth (a
fraction of a second). After upgrading boto3, regenerate it: ``.venv/bin/python -m team_config.instance_types``; a test
fails while the file and botocore disagree.
"""

from __future__ import annotations

import functools
from pathlib import Path

TYPES_FILE = Path(__file__).resolve().parent / "ec2_instance_types.txt"


@functools.cache
def known_instance_types() -> frozenset[str]:
    lines = TYPES_FILE.read_text().splitlines()
    return frozenset(line for line in lines if line and not line.startswith("#"))


def botocore_instance_types() -> tuple[str, list[str]]:
    """(botocore version, its EC2 ``InstanceType`` enum, sorted)."""
    import botocore
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    return botocore.__version__, sorted(model.shape_for("InstanceType").enum)


def main() -> None:
    version, types = botocore_instance_types()
    header = f"# EC2 instance types of botocore {version}; regenerate: .venv/bin/python -m team_config.instance_types\n"
    TYPES_FILE.write_text(header + "".join(f"{t}\n" for t in types))
    print(f"{TYPES_FILE}: {len(types)} instance types of botocore {version}")


if __name__ == "__main__":
    main()
