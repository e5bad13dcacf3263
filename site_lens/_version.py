"""The package version: one place for ``site_lens.__version__``, ``site-lens --version`` and pyproject."""

__version__ = "0.1.0"
