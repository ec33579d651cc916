"""The model's configuration, its initialisation and its parameters θ
(docs/theory/mathematics.md §M2, §M4, and §M10 for the model family).

- :class:`ModelConfig`: the sizes ``M, H, D`` of TF(M, H, d, D), which member of the
  model family runs (``member``: the paper's model by default) and the options of each member.
- :class:`InitConfig`: the paper's initialisation ``w₊, w₋, c₀, a₀``.
- :class:`Params`: θ = (w, C, a) and the extra blocks a member adds (its token matrices,
  value matrices, LayerNorm, classifier, …), one pytree.

What each member computes lives in its own module (``gflow.core.PaperModel``,
``gflow.core.FullModel``, …; the registry :data:`MEMBERS`); this module only knows their
names and asks the registered class to check the options it reads.
"""

from __future__ import annotations

import itertools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._registry import MEMBERS

_NORMS = ("sum", "layer")
_WINDOWS = ("aligned", "shifted")
_TOKEN_FORMS = ("direct", "factorised")

# Every member option of ModelConfig with its default: a member reads some of them (its class's
# ``options``); the others must keep their defaults (a value the member would ignore is an error,
# never silently dropped).
MEMBER_OPTIONS: dict[str, object] = {
    "norm": "sum",
    "head_norm": False,
    "windows": "aligned",
    "token_form": "direct",
    "token_init": 0.0,
    "value_init": 1.0,
    "layernorm": False,
    "proj_init": 0.01,
    "omega0": 1.0,
    "random_init": 0.0,
}


def subsets(H: int, D: int, *, token: bool = False, empty: bool = True) -> tuple[tuple[int, ...], ...]:
    """The selector's index set ``𝒮 = {S ⊆ {1..H} : |S| <= D}``, empty set
    included, ordered by size and then lexicographically (docs/theory/mathematics.md §M2).

    Heads are 1-based, so a set of heads reads as a set of offsets. With ``token = True``
    the sets are drawn from ``{0, 1..H}``, component 0 being the position's own token
    (the residual stream and the official Full model, §M10). With ``empty = False`` the empty set
    is left out (Nichani et al.'s member, which has no selector).
    """
    comps = range(0 if token else 1, H + 1)
    out = []
    for r in range(0 if empty else 1, D + 1):
        out.extend(itertools.combinations(comps, r))
    return tuple(out)


def subset_label(S: tuple[int, ...]) -> str:
    """``"∅"`` or ``"{1,2}"`` (component 0, the token, prints as 0)."""
    return "∅" if len(S) == 0 else "{" + ",".join(map(str, S)) + "}"


class ModelConfig(eqx.Module):
    """Sizes, member and options of the model (docs/theory/mathematics.md §M2, §M10).

    - `M`: window of the relative positional embedding (offsets ``1..M``).
    - `H`: number of heads of the first attention layer.
    - `D`: maximal size of a selected set of components, ``0 <= D <= H`` (``<= H + 1`` for
      the members whose sets may hold the token itself, ``"residual"`` and ``"full"``).
    - `member`: which model of the family runs (docs/guides/models.md): ``"paper"`` (default,
      the paper's TF(M, H, d, D)), ``"token"`` (token-aware first layer), ``"value"`` (value
      matrix per head, optional LayerNorm), ``"full"`` (the official code's Full model,
      ``TwoLayerTransformer``), ``"absolute"`` (absolute positional embeddings), ``"residual"``
      (a residual stream in the next-token framing), ``"linear_query"``, ``"linear_output"``,
      ``"bilinear"`` (linear classifiers in place of the second layer's scalar a).
    - `norm`: (paper) ``"sum"`` (default, the reference simulations: ``Z = Σ_S c_S``)
      or ``"layer"`` (exact layer normalisation, ``Z = ‖φ_q‖‖φ_l‖``).
    - `head_norm`: (paper) extension, the official code's simplified model (docs/theory/mathematics.md
      §M8.5): every head's output is normalised before the selector,
      ``v^(h) ← v^(h)/(‖v^(h)‖ + 1e-7)`` (an all-padding window, ``v = 0``,
      stays 0). Default ``False`` (the paper's model).
    - `windows`: (paper) ``"aligned"`` (default, the paper: every head attends
      offsets ``1..M``) or ``"shifted"`` (extension, the official code:
      head h attends offsets ``h..h+M−1`` with its own M weights, so the
      model reads ``span = H+M−1`` offsets). The Full model always has the official shifted
      windows; every other member the aligned ones.
    - `token_form`: (token) ``"direct"`` (a d×d matrix ``B_h`` per head added to the logits) or
      ``"factorised"`` (``B_h = Q_h K_hᵀ``, as the official code).
    - `token_init`: (token) the initial scale s: ``B_h = s·I`` (direct; default 0, the paper's
      model) or ``Q_h = K_h = s·I`` (factorised).
    - `value_init`: (value) ``W_OV,h = value_init·I`` at the start (default 1, the paper's model).
    - `layernorm`: (value) apply the official LayerNorm (mean subtracted, ε = 1e-5, trainable
      γ, β shared by the heads) to each head's output (default false).
    - `proj_init`: (full) the official ``proj_init``: ``Q_h = K_h = W_OV,h = proj_init·I``
      (default 0.01, as ``RPE/train.py``).
    - `omega0`: (linear_output) the output matrix starts at ``omega0·I`` (default 1).
    - `random_init`: (bietti) the scale σ of a small random start: every entry of its blocks drawn
      ``σ·N(0, 1)`` from seed 0; 0 (the default) the zero start.
    """

    M: int = eqx.field(static=True, default=3)
    H: int = eqx.field(static=True, default=3)
    D: int = eqx.field(static=True, default=2)
    norm: Literal["sum", "layer"] = eqx.field(static=True, default="sum")
    head_norm: bool = eqx.field(static=True, default=False)
    windows: Literal["aligned", "shifted"] = eqx.field(static=True, default="aligned")
    member: str = eqx.field(static=True, default="paper")
    token_form: Literal["direct", "factorised"] = eqx.field(static=True, default="direct")
    token_init: float = eqx.field(static=True, default=0.0)
    value_init: float = eqx.field(static=True, default=1.0)
    layernorm: bool = eqx.field(static=True, default=False)
    proj_init: float = eqx.field(static=True, default=0.01)
    omega0: float = eqx.field(static=True, default=1.0)
    random_init: float = eqx.field(static=True, default=0.0)

    def __check_init__(self):
        for name in ("M", "H"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"model.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.member, str) or self.member not in MEMBERS:
            raise ValueError(f"model.member must be one of {tuple(MEMBERS)}, got {self.member!r}")
        cls = MEMBERS[self.member]
        dmax = self.H + (1 if cls.token_component else 0)
        if not isinstance(self.D, (int, np.integer)) or not 0 <= self.D <= dmax:
            where = f"H={self.H}" if dmax == self.H else f"H+1={dmax} for model.member = {self.member!r}"
            raise ValueError(f"model.D must be an integer in [0, {where}], got {self.D!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"model.norm must be one of {_NORMS}, got {self.norm!r}")
        if self.head_norm is not True and self.head_norm is not False:
            raise ValueError(f"model.head_norm must be true or false, got {self.head_norm!r}")
        if self.windows not in _WINDOWS:
            raise ValueError(f"model.windows must be one of {_WINDOWS}, got {self.windows!r}")
        if self.token_form not in _TOKEN_FORMS:
            raise ValueError(f"model.token_form must be one of {_TOKEN_FORMS}, got {self.token_form!r}")
        if self.layernorm is not True and self.layernorm is not False:
            raise ValueError(f"model.layernorm must be true or false, got {self.layernorm!r}")
        for name in ("token_init", "value_init", "proj_init", "omega0", "random_init"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
                raise ValueError(f"model.{name} must be a finite number, got {v!r}")
        for name, default in MEMBER_OPTIONS.items():
            if name not in cls.options and getattr(self, name) != default:
                users = tuple(m for m, c in MEMBERS.items() if name in c.options)
                raise ValueError(
                    f"model.{name} = {getattr(self, name)!r} is an option of model.member in {users}, not of "
                    f"model.member = {self.member!r} (leave it at its default {default!r})"
                )
        cls.check_config(self)

    @property
    def family(self):
        """The member class of the model family this configuration runs (``MEMBERS[member]``)."""
        return MEMBERS[self.member]

    @property
    def span(self) -> int:
        """Number of offsets the first layer reads: ``M`` (aligned) or ``H+M−1`` (shifted)."""
        return self.M if self.windows == "aligned" and self.member != "full" else self.H + self.M - 1

    @property
    def self_match(self) -> bool:
        """Whether the paper member's positions layout needs the self-match tensors ``Gs``
        (``‖v_l^(h)‖`` enters κ: ``norm="layer"`` or ``head_norm``)."""
        return self.norm == "layer" or bool(self.head_norm)

    def own_offset_index(self, h: int) -> int:
        """Index in ``w[h-1]`` of the entry the initialisation puts ``w₊`` on
        (head h's own offset h): ``h−1`` (aligned) or ``0`` (shifted: the
        first entry of the window ``h..h+M−1``)."""
        return h - 1 if self.windows == "aligned" and self.member != "full" else 0

    @property
    def subsets(self) -> tuple[tuple[int, ...], ...]:
        """The selector's index set of this member (:func:`subsets`)."""
        cls = MEMBERS[self.member]
        if cls.one_set:
            return (tuple(range(1, self.H + 1)),)
        return subsets(self.H, self.D, token=bool(cls.token_component), empty=bool(cls.empty_set))

    @property
    def membership(self) -> np.ndarray:
        """``(|𝒮|, H)`` 0/1 matrix: ``[S, h-1] = 1{h ∈ S}`` (heads only)."""
        m = np.zeros((len(self.subsets), self.H))
        for r, S in enumerate(self.subsets):
            for h in S:
                if h >= 1:
                    m[r, h - 1] = 1.0
        return m


class InitConfig(eqx.Module):
    """The paper's initialisation (docs/theory/mathematics.md §M4): ``w^(h)_i = w_plus`` if ``i = h``
    else ``w_minus``; ``C_S = c0`` for every S; ``a = a0``. With
    ``model.windows = "shifted"``, ``w_plus`` sits on the first entry of head
    h's window (offset h), as in the official code. A member's extra blocks start where its
    options say (``model.token_init``, ``model.value_init``, …).

    - `w_plus`: the RPE weight of head h on its own offset h (default 3).
    - `w_minus`: the RPE weight on every other offset (default 0.1).
    - `c0`: every selector weight ``C_S`` (non-zero; default 0.01, so ``c_S = 10⁻⁴``).
    - `a0`: the classifier scale ``a`` (default 0.01).
    """

    w_plus: float = 3.0
    w_minus: float = 0.1
    c0: float = 0.01
    a0: float = 0.01

    def __check_init__(self):
        for name in ("w_plus", "w_minus", "c0", "a0"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"init.{name} must be finite, got {getattr(self, name)!r}")
        if self.c0 == 0:
            raise ValueError("init.c0 must be non-zero (c_S = c0² would vanish and Σc = 0), got 0")


BLOCKS = ("w", "C", "a")


class Params(eqx.Module):
    """θ = (w, C, a) and a member's extra blocks: RPE weights ``(H, M)``, selector weights
    ``(|𝒮|,)`` with ``c_S = C_S²``, classifier scale (scalar), and `x`, the extra blocks by
    name (empty for the paper's model: its θ is exactly (w, C, a))."""

    w: Float[Array, "H M"]
    C: Float[Array, " nS"]
    a: Float[Array, ""]
    x: dict = eqx.field(default_factory=dict)

    @property
    def s(self) -> Float[Array, "H M"]:
        """Copier attention ``s^(h) = softmax(w^(h))``."""
        return jax.nn.softmax(self.w, axis=-1)

    @property
    def c(self) -> Float[Array, " nS"]:
        return self.C**2

    @property
    def c_frac(self) -> Float[Array, " nS"]:
        """``c / Σc``."""
        c = self.C**2
        return c / c.sum()

    @property
    def names(self) -> tuple[str, ...]:
        """The block names: ``w, C, a`` and the extra blocks in sorted order."""
        return BLOCKS + tuple(sorted(self.x))

    def get(self, name: str):
        """The block `name` (``"w"``, ``"C"``, ``"a"`` or an extra block)."""
        return getattr(self, name) if name in BLOCKS else self.x[name]

    def blocks(self) -> dict:
        """Every block by name (:attr:`names`)."""
        return {b: self.get(b) for b in self.names}

    def with_blocks(self, new: dict) -> Params:
        """A copy with the blocks in `new` replaced (the others kept)."""
        return Params.from_blocks({**self.blocks(), **new})

    @property
    def first_layer(self):
        """θ without C and a: ``w`` for the paper's model, else the dict of w and the extra blocks
        (:meth:`assemble` is its inverse)."""
        if not self.x:
            return self.w
        return {"w": self.w, **self.x}

    @staticmethod
    def assemble(first, C, a) -> Params:
        """θ from the first layer `first` (the paper's w, or a dict of every block but C and a:
        w and a member's extra blocks, as :meth:`gflow.Trajectory.first_layer` gives), C and a."""
        if isinstance(first, dict):
            return Params.from_blocks({**first, "C": C, "a": a})
        return Params(w=first, C=C, a=a)

    @staticmethod
    def from_blocks(blocks: dict) -> Params:
        """θ from a dictionary of every block by name."""
        extra = {k: v for k, v in blocks.items() if k not in BLOCKS}
        return Params(w=blocks["w"], C=blocks["C"], a=blocks["a"], x=extra)


def flatten(p: Params) -> Float[Array, " P"]:
    """θ as one vector: ``w`` row-major, ``C``, ``a``, then the extra blocks (sorted by name,
    each row-major); ``P = H·M + |𝒮| + 1`` for the paper's model."""
    parts = [jnp.ravel(p.w), jnp.ravel(p.C), jnp.reshape(p.a, (1,))]
    parts += [jnp.ravel(p.x[k]) for k in sorted(p.x)]
    return jnp.concatenate(parts)


def unflatten(x: Float[Array, " P"], H: int, M: int, *, like: Params | None = None) -> Params:
    """The inverse of :func:`flatten` (`like`: a θ with the member's extra blocks, whose shapes
    are read; ``None`` for the paper's θ)."""
    k = H * M
    nS = x.shape[0] - k - 1 if like is None else like.C.shape[0]
    w, C, a = x[:k].reshape(H, M), x[k : k + nS], x[k + nS]
    extra, i = {}, k + nS + 1
    for name in sorted(like.x) if like is not None else ():
        shape = np.shape(like.x[name])
        n = int(np.prod(shape))
        extra[name] = x[i : i + n].reshape(shape)
        i += n
    return Params(w=w, C=C, a=a, x=extra)


def paper_w(model: ModelConfig, init: InitConfig, dtype) -> Float[Array, "H M"]:
    """The paper's RPE initialisation: head h starts on its own offset h (``w_plus`` there,
    ``w_minus`` elsewhere; :meth:`ModelConfig.own_offset_index`)."""
    eye = np.zeros((model.H, model.M))
    eye[np.arange(model.H), [model.own_offset_index(h) for h in range(1, model.H + 1)]] = 1.0
    return jnp.asarray(init.w_minus + (init.w_plus - init.w_minus) * eye, dtype)


def init_params(model: ModelConfig, init: InitConfig = InitConfig(), *, d: int | None = None,
                L: int | None = None, dtype=jnp.float64) -> Params:  # fmt: skip
    """The initialisation of the configured member (docs/theory/mathematics.md §M4, §M10): the
    paper's ``(w, C, a)`` — head h starts on offset h (aligned windows require ``H <= M``;
    shifted windows put ``w_plus`` on ``w[h-1, 0]``) — and the member's extra blocks at their
    starting values. `d` (vocabulary) and `L` (context length) are needed by the members
    whose extra blocks have those sizes (every member but the paper's)."""
    if model.windows == "aligned" and model.member != "full" and model.H > model.M:
        raise ValueError(f"the paper's initialisation needs model.H <= model.M, got H={model.H}, M={model.M}")
    w = paper_w(model, init, dtype)
    C = jnp.full((len(model.subsets),), init.c0, dtype)
    p = Params(w=w, C=C, a=jnp.asarray(init.a0, dtype))
    extra = MEMBERS[model.member].initial_extra(model, init, p, d=d, L=L, dtype=dtype)
    return p if not extra else Params(w=p.w, C=p.C, a=p.a, x=extra)
