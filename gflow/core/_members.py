"""The members of the model family (docs/guides/models.md): importing this module registers
every one of them (``gflow.core._registry.MEMBERS``). To add a member, write its module and
add its import here."""

from __future__ import annotations

from . import (
    _member_full,  # noqa: F401  (the official code's Full model: "full")
    _member_paper,  # noqa: F401  (the paper's model: "paper")
    _member_residual,  # noqa: F401  (a residual stream, next-token framing: "residual")
    _member_token,  # noqa: F401  (a token-aware first layer: "token")
    _member_value,  # noqa: F401  (a value matrix per head and LayerNorm: "value")
)
from ._model import ModelConfig
from ._registry import MEMBERS


def member_of(model: ModelConfig):
    """The member of the model family that `model` configures (``model.member``), an
    instance of its final class (``gflow.core.PaperModel``, …)."""
    return MEMBERS[model.member](model)
