"""Commerce Flywheel: the platform package."""

__version__ = "0.1.0"
