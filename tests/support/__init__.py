"""Helpers shared by keel's tests (importable as `support.*`; tests/conftest.py puts tests/ on sys.path)."""
