"""The tests of ``store``."""
