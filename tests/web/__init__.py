"""The tests of ``web``."""
