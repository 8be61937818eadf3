"""nanoserve.runtime."""
