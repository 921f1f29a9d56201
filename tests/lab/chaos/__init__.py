"""The chaos runner (`lab/chaos/`, `ipamgc chaos`): runs judged on ground truth, faults, the soak."""
