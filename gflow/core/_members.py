"""The members of the model family (docs/guides/models.md): importing this module registers
every one of them (``gflow.core._registry.MEMBERS``). To add a member, write its module and
add its import here (and its name to :data:`ORDER`, the order the docs and messages list)."""

from __future__ import annotations

from . import (  # noqa: F401  (each import registers its member)
    _member_absolute,  # "absolute": absolute positional embeddings
    _member_bilinear,  # "bilinear": a bilinear second layer
    _member_edelman,  # "edelman": Edelman et al.'s minimal model (linear attention)
    _member_full,  # "full": the official code's Full model
    _member_linear_output,  # "linear_output": an output matrix on the attended average
    _member_linear_query,  # "linear_query": a linear classifier on the query's features
    _member_nichani,  # "nichani": Nichani et al.'s reduced model (causal position scores)
    _member_paper,  # "paper": the paper's model
    _member_residual,  # "residual": a residual stream, next-token framing
    _member_token,  # "token": a token-aware first layer
    _member_value,  # "value": a value matrix per head and LayerNorm
)
from ._model import ModelConfig
from ._registry import MEMBERS

ORDER = ("paper", "token", "value", "full", "absolute", "residual", "linear_query", "linear_output", "bilinear", "nichani", "edelman")
_registered = dict(MEMBERS)
MEMBERS.clear()
MEMBERS.update({n: _registered[n] for n in ORDER if n in _registered})
MEMBERS.update({n: c for n, c in _registered.items() if n not in MEMBERS})


def member_of(model: ModelConfig):
    """The member of the model family that `model` configures (``model.member``), an
    instance of its final class (``gflow.core.PaperModel``, …)."""
    return MEMBERS[model.member](model)
