"""Benchmarks: scripts run by hand or by `make bench`, never collected as tests.

They print ratios against bare Celery measured in the same invocation (docs/benchmarks.md).
"""
