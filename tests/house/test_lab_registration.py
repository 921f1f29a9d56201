"""The product reaches the lab through one registration point (issue 47): `ipamgc/cli.py` reads the lab's
table of commands (`lab.commands.COMMANDS`) only when a command the product does not own is asked for, or
the list is shown.  Checked in a fresh interpreter, since other tests of this process import the lab."""

from __future__ import annotations

import json
import subprocess
import sys


def _lab_modules_after(code: str) -> list[str]:
    script = (
        f"import json, sys\n{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'lab')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    modules: list[str] = json.loads(out.stdout)
    return modules


def test_a_component_command_imports_nothing_of_the_lab() -> None:
    names = ("watch", "work", "lead", "up")
    code = f"from ipamgc.cli import cli\nfor name in {names!r}:\n    assert cli.commands[name]"
    assert _lab_modules_after(code) == []


def test_a_lab_command_imports_its_own_module_only() -> None:
    code = "from ipamgc.cli import cli\nassert 'compare' in cli.commands and cli.commands['compare'].name"
    loaded = _lab_modules_after(code)
    assert {"lab.commands", "lab.commands.compare"} <= set(loaded)
    others = {f"lab.commands.{name}" for name in ("bench", "chaos", "demo", "sim")}
    assert not others & set(loaded)


def test_the_list_holds_the_product_and_the_lab() -> None:
    from ipamgc.cli import LAZY, cli, lab_commands

    assert set(lab_commands()) == {"bench", "chaos", "compare", "demo", "sim"}
    assert set(cli.commands.keys()) == set(LAZY) | set(lab_commands())
