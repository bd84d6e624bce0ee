"""``python -m trainctl`` (the ``trainctl`` command in .venv/bin runs this)."""

import sys

from trainctl.cli import main

sys.exit(main())
