"""`python -m tuner` is `python -m tuner.optimize`."""

from tuner.cli import exit_with
from tuner.optimize import main

exit_with(main())
