"""The engine's typed errors (defined in `keel.errors`, a leaf module that the layers below the engine, such
as `keel.structured`, can import without importing the engine package)."""

from __future__ import annotations

from keel.errors import ConfigError, RequestValidationError

__all__ = ["ConfigError", "RequestValidationError"]
