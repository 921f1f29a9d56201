"""`ipamgc compare`: ipamgc against Calico's own kube-controllers, decision by decision.

A cluster (a snapshot in `ipamgc check`'s format, or a random one, `generate`) is loaded into a fresh
sandboxed simulated cluster twice (`sandbox`): once collected by Calico's kube-controllers binary, once
by ipamgc's real components (`collectors`), each until quiet at a short grace period, with every IPAM
write recorded (`recorder`).  The two outcomes are compared against the cluster's ground truth (`facts`)
and every difference is classified as one the README declares, a known item of issue 35, or undeclared
(`diff`); `run` does one cluster, `report` prints.

May import: the simulated cluster (`lab.apiserver`, `lab.cluster`), Calico's binary
(`lab.kubecontrollers`) and the product (`shared`; `ipamgc`'s process helpers to run its components).
"""
