"""The engine as a server and a library use it: the async engine, request streams, LLM."""
