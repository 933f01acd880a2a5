"""Deleting stream entries so that their bytes are gone too: ``worker.streams``, whose
``compact`` the dead-letter retry uses as well as the redaction listeners."""

from engram.worker.admin.streams import compact, delete

__all__ = ["compact", "delete"]
