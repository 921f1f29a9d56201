"""ipamgc's front door: the command line, the components' entry points, the local supervisor (`up`), the
read-only commands (`check`, `status`, `audit`) and `release`, and what every component process runs.

The instruments (the simulated cluster, the benchmark, chaos, compare, the demo) are the lab (`lab/`):
nothing here imports it but `ipamgc/cli.py`'s `lab_commands`, the one registration point of its commands.
"""

__version__ = "0.1.0"
