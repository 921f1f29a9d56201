"""The lab's subcommands of `ipamgc`: `bench`, `chaos`, `compare`, `demo`, `sim`, one module each.

Owns `COMMANDS`, the lab's one table of its commands: `ipamgc/cli.py` reads it (`lab_commands`) when a
command the product does not own is asked for or the list is shown, and imports a command's module only
when that command runs, so a component process (`ipamgc work`) never imports the lab.  This module
imports nothing, so reading the table costs nothing.  `python -m lab.commands.bench` runs the benchmark
on its own (`python -m lab.chaos` the chaos runner).

May import (the command modules): the lab, and the product's command-line helpers (`ipamgc.commands`,
`ipamgc.commands.flags`) and runtime.
"""

from __future__ import annotations

COMMANDS: dict[str, str] = {
    "bench": "lab.commands.bench:bench",
    "chaos": "lab.commands.chaos:chaos",
    "compare": "lab.commands.compare:compare",
    "demo": "lab.commands.demo:demo",
    "sim": "lab.commands.sim:sim",
}
