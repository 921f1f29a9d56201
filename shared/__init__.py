"""The ipamgc domain: Calico IPAM models, the validity rules and everything else that does no I/O."""
