"""Benchmarks: scripts run by hand or by `make bench`, never collected as tests (DESIGN §8)."""
