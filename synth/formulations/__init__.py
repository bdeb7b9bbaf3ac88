"""Encoders: one module per formulation, each ``encode(problem) -> Encoding`` and ``decode``."""
