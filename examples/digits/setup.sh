#!/usr/bin/env bash
# The setup of examples/digits/job.yaml: run with bash on each node before the trainer, once per node boot. A job
# installs its requirements here, for instance from a wheelhouse in its code archive:
#   python -m pip install --no-index --find-links wheelhouse -r requirements.txt
# The digits trainer needs nothing beyond the AMI's PyTorch; this setup shows what it has.
set -euo pipefail
echo "setup on $(hostname): $(nproc) CPUs, inputs: $(ls /opt/ml/input/digits 2>/dev/null | wc -l) files"
