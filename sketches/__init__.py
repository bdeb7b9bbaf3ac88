"""Built-in communication sketches, found by name."""
