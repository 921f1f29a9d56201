"""The simulated cluster: CNI driver, workload, leak scenarios and ground truth."""
