"""The tests of ``worker``."""
