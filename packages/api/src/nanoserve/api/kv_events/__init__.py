"""KV-cache events for llm-d: the publisher and its `--kv-events-config`."""
