"""Deleting stream entries so that their bytes are gone too: ``worker.streams``, whose
``compact`` the dead-letter retry uses as well as the redaction listeners."""

from worker.streams import compact, delete

__all__ = ["compact", "delete"]
