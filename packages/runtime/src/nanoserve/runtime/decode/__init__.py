"""The recorded decode step: persistent inputs, recordings, the capture guard, the warm-up."""
