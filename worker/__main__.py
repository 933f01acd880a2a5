"""``python -m worker`` is the ``engram`` command."""

from .cli import main

raise SystemExit(main())
