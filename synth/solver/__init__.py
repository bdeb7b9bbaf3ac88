"""The solver boundary: the only place that imports highspy (lazily); pulp is the export layer."""
