"""Whetstone inside other agents: faces that put a library where another program already works
(``mcp_server``/``mcp_app``: an MCP server for coding agents and IDEs). They sit at the layer of
``engine/server`` and are built only by the commands that use them."""
