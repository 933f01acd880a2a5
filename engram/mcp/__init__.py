"""The MCP server: agents reach their memory directly, through the Model Context
Protocol's tools (the official SDK, ``pip install 'engram[mcp]'``).

Two doors, one set of tools (``contract``): ``engram mcp --scope JSON`` over stdio
(``cli``), and streamable HTTP at ``/mcp`` on the dashboard's server, where a scoped
token decides everything (``http``). The scope is never a tool argument. Writes go
through the streams like any producer's and wait for their receipt within a bound
(``memory``); reads go to the store on the caller's scope only.
"""
