"""The tests of ``jobs``."""
