"""The pure Calico domain (`shared/`): parsing, rules, block operations, records, keys, names, consistency."""
