"""Administration: dead letters and their selection, pauses, metrics."""
