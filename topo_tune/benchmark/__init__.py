"""Benchmark pieces shared by the agent, the controller and the ``sim`` backend.

Pure code (no gRPC, no torch): nccl-tests arithmetic (``collectives``, ``sweep``,
``iteration_stats``), the job description (``job_spec``) and results (``results``), the
environment policy (``env_policy``), the nccl-tests-style table (``table``) and the
protobuf conversions (``wire``). Import the modules directly; this package re-exports nothing
so that a worker process importing one module does not pull in protobuf.
"""
