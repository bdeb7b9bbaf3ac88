"""Running programs on real processes (torch.distributed) and profiling links between them."""
