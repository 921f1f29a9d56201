"""The benchmark (`lab/bench/`, `ipamgc bench`): modes, phases, CPU, the sweep, small real runs."""
