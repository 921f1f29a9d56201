"""The Kubernetes edge (`kubeio/`): raw requests, connections, config, watch streams, Calico's API group."""
