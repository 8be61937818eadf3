"""One engine step's parts: scheduler, blocks, sequences, runner, sampler, verify, KV events."""
