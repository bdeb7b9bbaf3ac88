"""Backends: pure functions from a Schedule (or an MSCCL program) to text, and parsers of foreign formats."""
