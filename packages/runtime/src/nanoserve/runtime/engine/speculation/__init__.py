"""Speculative decoding: the speculator and its proposers (prompt lookup, a draft model)."""
