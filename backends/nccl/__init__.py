"""Stock NCCL's files: topology-dump import, graph-file export, nccl-tests output parsing and fitting."""
