"""The local supervisor (`ipamgc up`: supervisor.py, stack.py): pre-flight, restarts, its children."""
