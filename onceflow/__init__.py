"""onceflow: durable, retry-safe execution of side-effecting AI-agent tool calls on Temporal."""
