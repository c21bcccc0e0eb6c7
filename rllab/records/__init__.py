"""What a run writes down and reads back: TOML text (the config it records, values given on the
command line, the line of a key) and the provenance record of what produced a result."""
