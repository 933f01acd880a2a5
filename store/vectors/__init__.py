"""Vectors: embedders, embedding generations, approximate indexes."""
