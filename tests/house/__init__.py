"""The house's rules across rooms: module size, import cycles, flag names, README tables, lab hook."""
