"""The agent's real benchmark backends (nccl, gloo): worker processes and their launcher.

``benchmark_executor.BenchmarkExecutor`` is the entry the agent's command loop calls (in a thread);
``launcher`` starts and polices worker processes; ``kept_workers`` keeps them across jobs of one
environment; ``worker`` is the process itself (``python -m topo_tune.agent.bench.worker CONFIG``);
``collective_ops`` holds the torch code.
Only ``worker`` and ``collective_ops`` import torch, so the agent imports this package freely.
"""
