"""`python -m tuner` is `python -m tuner.optimize`."""

import sys

from tuner.optimize import main

sys.exit(main())
