"""Consuming the partition streams: a worker's partitions, read, committed, answered."""
