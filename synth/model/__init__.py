"""The problem as the user states it: topology (built-ins, node composition), collectives, sketches."""
