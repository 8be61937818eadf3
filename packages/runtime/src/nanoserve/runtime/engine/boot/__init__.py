"""Building an engine: loading, pricing, warming; the boot's heap."""
