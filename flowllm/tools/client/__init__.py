"""The client side of tools: the pool of MCP connections, routing, argument checks, results."""
