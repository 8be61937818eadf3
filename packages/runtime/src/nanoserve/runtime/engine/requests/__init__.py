"""A request as the engine takes it: sampling parameters, checks, times."""
