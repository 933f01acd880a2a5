"""The composition root: the ``engram`` command and ``engram up``.

It sits above every other package: it starts the embedded servers, the stream
workers and whatever else runs beside them, and wires them together. Nothing
in ``store``, ``worker``, ``jobs`` or ``web`` imports it.
"""
