"""Generated code for the ``topo_tune.v1`` wire contract. Never edit: run ``make protos``."""
