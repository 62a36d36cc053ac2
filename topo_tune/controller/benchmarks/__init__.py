"""Benchmark jobs across nodes: ``plan`` builds a job's rank map and folds its results, ``service`` stores,
dispatches, collects and times them out. Here "job" means a benchmark job only."""
