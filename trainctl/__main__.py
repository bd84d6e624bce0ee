"""``python -m trainctl``: the same as the ``trainctl`` console script (pyproject.toml), ``cli.main``."""

import sys

from trainctl.cli import main

sys.exit(main())
