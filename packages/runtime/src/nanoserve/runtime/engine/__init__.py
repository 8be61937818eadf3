"""Requests to tokens: sequences, the scheduler, the runner, sampling, the engine and its async face."""
