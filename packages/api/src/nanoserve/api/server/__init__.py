"""The server itself: settings, state, admission, errors, health, metrics, the engine client."""
