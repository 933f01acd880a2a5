"""The tests of ``engram``."""
