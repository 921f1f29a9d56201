"""The lab: the instruments ipamgc is measured and judged with, never a part of what it ships.

Owns the simulated kube-apiserver (`lab.apiserver`), the simulated workload and Calico CNI on it with
their ground truth (`lab.cluster`), the benchmark (`lab.bench`), the chaos runner (`lab.chaos`), the
comparison with Calico's own collector (`lab.compare`), the real kube-apiserver + etcd harness
(`lab.realapi`), Calico's kube-controllers binary run as a yardstick (`lab.kubecontrollers`), the demo
(`lab.demo`) and their subcommands of `ipamgc` (`lab.commands`).

May import: the product (`shared`, `kubeio`, `producer`, `workers`, `ipamgc`'s runtime and command-line
helpers) — the lab drives the real components.  The product never imports the lab: `ipamgc/cli.py`'s
`lab_commands` is the one edge, read only when a lab command is asked for (import-linter's contracts in
`pyproject.toml`).
"""
