"""Benchmarks: printed tables + JSON, never timed tests."""
