"""agentfunnel."""
