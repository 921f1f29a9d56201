"""The house's rules across the rooms: module size, import cycles, flag names, README tables, lab registration."""
