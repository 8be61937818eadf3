"""OpenAI's Responses API: its request translated onto the chat path, its answers."""
