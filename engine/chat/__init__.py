"""Chat mode: one adapted completion per call, no agent loop, for every host that has one.

    adapter.py    the chat adapter: the runtime methods' guidance into the system message
    exchange.py   one exchange as a trace, feedback checks, ``Engine.chat``
    client.py     ``Engine.wrap``: the adapter in front of an ``openai`` client, in-process

``Engine`` (``chat``, ``wrap``), the HTTP server (``engine/server/``), the MCP server and the
LangChain model all adapt through here; none of it imports the HTTP app, FastAPI or each
other's hosts.
"""
