"""Kubernetes mode, shared by the agent and the controller: where the API is, what a node says about itself
(its rack label, whether its GPUs are free for benchmarks), leader election on a Lease, and the label that
routes the controller Service to the leader's pod.

Only ``api.py`` imports the ``kubernetes`` client (the optional ``kubernetes`` extra); every other module
here is plain data and logic, so bare-metal users never load it. This package imports neither the agent nor
the controller.

Non-goals: watching objects, writing nodes (cordon) or any other object than the controller's Lease and
the label on its own pod.
"""
