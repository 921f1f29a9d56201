"""`ipamgc chaos`: the chaos runner (`lab.chaos`) on the command line, beside `ipamgc bench`.

Its options are the runner's own (`ipamgc chaos --help`); they are passed through unchanged, so
`ipamgc chaos --seed 3` and `python -m lab.chaos --seed 3` are the same run.
"""

from __future__ import annotations

import sys

import click

from lab.chaos.runner import main


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def chaos(args: tuple[str, ...]) -> None:
    """Run the system under injected faults on a simulated cluster and judge it (docs/chaos.md)."""
    sys.exit(main(list(args)))
