"""The ``topo-tune`` command line: the only layer that reads the environment and configures logging."""
