"""`python -m ipamgc.chaos`: the chaos runner on its own (`ipamgc chaos` is the same)."""

import sys

from ipamgc.chaos.runner import main

sys.exit(main())
