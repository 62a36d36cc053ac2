"""topo-tune: measure a GPU cluster, search NCCL configurations and ring orders, prove and roll out the winner.

The package holds three components (``agent``, ``controller``, ``tuner``), the wire contract
generated from ``protos/`` (``topo_tune.v1``) and the small shared pieces all of them use.
"""

__version__ = "0.1.0"
