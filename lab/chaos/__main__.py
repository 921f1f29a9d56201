"""`python -m lab.chaos`: the chaos runner on its own (`ipamgc chaos` is the same)."""

import sys

from lab.chaos.runner import main

sys.exit(main())
