"""Clients engram did not write, on its MCP server: both protocol generations of the
Python SDK, and the official TypeScript SDK run by node."""
