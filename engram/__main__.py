"""``python -m engram`` is the ``engram`` command."""

from .cli import main

raise SystemExit(main())
