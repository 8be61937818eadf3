"""Structured outputs: grammars a request asks for, compiled once and matched per sequence."""
