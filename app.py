"""`litestar run` from the repository root finds the factory here (NANOSERVE_* configure it)."""

from nanoserve.api.app import create_app

__all__ = ["create_app"]
