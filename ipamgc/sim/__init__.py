"""The simulated cluster: a Kubernetes API server and a Calico CNI that leaks on purpose."""
