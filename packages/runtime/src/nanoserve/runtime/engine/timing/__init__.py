"""Step cost: timings measured at boot, prices estimated live, the cache that keeps timings."""
