"""The simulated workload (`lab/cluster/`): CNI, kubelets, churn, KubeVirt, pod sizes, ground truth."""
