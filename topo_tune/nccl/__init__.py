"""What NCCL reads and names: its environment variables (the one catalogue), its collectives, the backends.

``collectives.py`` is the one list of collectives with every spelling of each. ``variables.py`` lists
every variable topo-tune knows, once: its value type, its role (searched, tunable,
site, forbidden, managed, debug), whether the ``sim`` backend models it, why, and for searched ones the
dimension of the search space it belongs to. The environment policy (``benchmark/env_policy.py``), the
search space (``tuner/space.py``), the site-fixed keys, the simulator's knob table (``sim/knobs.py``) and the
docs' table (``docs/nccl-variables.md``) are derived from it. ``backends.py`` is the one list of benchmark
backends (nccl, gloo, sim) and what each can do.
"""
