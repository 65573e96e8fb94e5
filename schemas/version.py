"""The package version, in one place (setup.py and the manifest read it)."""

__version__ = "0.1.0"
