"""Offline exploration: the (steps, rounds, chunks) frontier, the per-size choice, MSCCL bundles, plots, workers."""
