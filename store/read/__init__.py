"""The read path: the operator's lists and pages, recall, find, export."""
