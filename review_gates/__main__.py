import sys

from review_gates.pull_request import main

sys.exit(main())
