"""nanoserve.api."""
