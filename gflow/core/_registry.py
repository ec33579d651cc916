"""The registry of the model family's members: ``model.member`` names a class here
(docs/guides/models.md). Each member module registers its final class with :func:`register`;
``gflow.core._members`` imports every member module, so that list of imports is the whole
registration of a member."""

from __future__ import annotations

MEMBERS: dict[str, type] = {}


def register(cls: type) -> type:
    """Register a member class under its ``name`` (a class decorator)."""
    name = cls.name
    if name in MEMBERS and MEMBERS[name] is not cls:
        raise ValueError(f"two model members are named {name!r}")
    MEMBERS[name] = cls
    return cls
