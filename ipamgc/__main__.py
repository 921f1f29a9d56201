"""`python -m ipamgc` runs the command line."""

from ipamgc.cli import main

main()
