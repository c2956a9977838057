"""Helpers shared by keel's tests (importable as `support.*`: pytest's `pythonpath` in pyproject.toml puts tests/ on sys.path)."""
