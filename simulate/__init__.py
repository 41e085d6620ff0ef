"""Lifecycle simulation: scheduler, topology, parallelism, memory (issue 4)."""
