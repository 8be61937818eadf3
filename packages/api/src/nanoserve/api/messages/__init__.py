"""Anthropic's Messages API: its request translated onto the chat path, its answers."""
