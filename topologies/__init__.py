"""Built-in topology JSON files, found by name (``synth topo list``)."""
