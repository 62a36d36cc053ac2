"""The job's own workload: its collectives read from what it recorded, turned into ``cluster.yaml`` weights.

``topo-tune workload import`` reads PyTorch profiler traces (``torch_trace``), NCCL Inspector logs
(``inspector_log``) and the tuner plugin's call counts (``plugin_record``) into one per-rank count of calls
per (collective, size) (``calls``), weighs the tuner's size buckets by the time the job spends in each
(``weights``), and writes the ``workload:`` block of ``cluster.yaml`` (``workload_block``).

Non-goals: running or profiling a job (the job does that; ``docs/workload.md`` says how), and tuning.
"""
