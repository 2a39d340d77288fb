"""Whetstone inside other agents: faces that put a library where another program already
works. ``mcp_server``/``mcp_app``: an MCP server for coding agents and IDEs (built only by
``whetstone mcp``); ``langchain``/``langchain_tools``: a LangChain chat model, a LangGraph node
and the learned tools as LangChain tools. They sit at the layer of ``engine/server``."""
