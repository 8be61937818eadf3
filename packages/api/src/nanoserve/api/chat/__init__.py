"""The chat pieces every protocol shares: the request in OpenAI's shape, the prompt, tools,
reasoning, structured outputs, the engine's inputs, and an answer's pieces."""
