"""The write path: operations, their model phase, planning and committing them."""
