"""`python -m tuner` is `python -m tuner.optimize`."""

import sys

from .optimize import main

sys.exit(main())
