"""The package version, importable without torch (``site-lens --version``)."""

__version__ = "0.1.0"
