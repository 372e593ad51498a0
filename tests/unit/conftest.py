"""Unit tests share the ``run_module`` fixture from the repository's root conftest.py."""
