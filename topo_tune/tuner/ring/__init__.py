"""Ring planning: the ring record, the exact and heuristic optimizers, GPU order inside a node, rank maps."""
