"""Benchmarks' shared pieces: the hardware table that turns measured throughput into cost and utilization."""
