"""`ipamgc compare` (`lab/compare/`): the comparison with Calico's own collector."""
