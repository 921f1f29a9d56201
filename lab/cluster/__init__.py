"""The simulated cluster: the workload (nodes, pods, KubeVirt VMs, churn, kubelets) and a Calico CNI and
IPAM that write what Calico writes — leaking on purpose — with the ground truth of every IP.

Owns the actors that change a cluster (`cluster`, `cni`, `ipam`, `churn`, `nodechurn`, `kubelet`,
`kubevirt`), the shape of their objects (`objects`, `podshape`, `podspec`, `podstatus`, `managedfields`),
bulk loading (`loading`), the leak scenarios (`leaks`), the ground truth (`truth`), the same actors on
any API server over REST (`restapi`, `resthook`) and the simulator's scale measurement (`scale`).

May import: the simulated API server (`lab.apiserver`, the store the actors write through) and `shared`'s
domain (block operations, names, addresses).  Not the rest of the lab, nor the product's components.
"""
