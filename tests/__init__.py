"""ipamgc tests."""
