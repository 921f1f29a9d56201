"""The simulated kube-apiserver (`lab/apiserver/`): its API, semantics, API groups, Leases."""
