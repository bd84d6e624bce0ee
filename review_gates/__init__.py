"""The review gates run on synthesized templates beyond cdk-nag's (which run during synth): cfn-lint with the
warnings allowed in ``cfn-lint-allowed.yaml``, checkov with the network guard; and the pull-request review that
synthesizes a base and a head and runs them all (``python -m review_gates --base REF``, ``make review``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class GateError(Exception):
    """A gate could not run, or its configuration is wrong: one line naming the file and the fix."""
