"""The per-node agent: discovery, benchmark workers, staged configs, and the session with the controller."""
