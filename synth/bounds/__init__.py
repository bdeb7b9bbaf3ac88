"""Lower bounds: the physical limit (bandwidth cuts, alpha diameter) and rounds per chunk for the step search."""
