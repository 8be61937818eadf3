"""The engine's configuration: what a user asks for, and what it resolves to."""
