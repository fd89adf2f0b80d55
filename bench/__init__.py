"""LEAD benchmarks: translate throughput, fitting cost, quality on real data, migration cost.

Run everything with ``bash bench/run.sh`` (``--quick`` for a smoke run); results land in
``bench/results/``. Nothing here is part of the library or the test suite.
"""
