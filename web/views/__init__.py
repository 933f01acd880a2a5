"""The dashboard's pages: each view reads, then renders one template (or its partial)."""
