"""Experiments that write results folders: runs, the benchmark, sweeps, and their reports.

  run             one task end to end, as ``site-lens run`` does it
  bench           every (task, method, seed) row, resumable and sharded
  bench_report    the bench's tables
  report          the head-specificity report over run folders
  sweep           the minimal-head-set study of one task
  minimal_report  tables and figures of sparsify folders
"""
