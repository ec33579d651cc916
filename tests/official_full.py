"""An independent transcription, in numpy, of the official code's Full model's forward pass:
``TwoLayerTransformer.forward`` of ``RPE/model.py`` in the paper's official repository
(gszfwsb/Unveiling-Induction-Heads), with ``RPEAttention`` as its first layer and
``PolyKernelMultiHeadAttention(num_heads=1, num_components=H+1, max_individual_degree=1,
low_degree=D, standard_LN=False, a="learnable")`` as its second, and ``nn.CrossEntropyLoss``
applied to its output (``RPE/train.py``).

It follows the PyTorch code operation by operation — the (T+1)×(T+1) logit matrix of each head
with its −∞ entries, its diagonals filled with the RPE weights ``W[j+h, h]`` and the 1e-6
diagonal, ``X̃ QKᵀ X̃ᵀ`` added, the softmax, ``@ X̃ @ o_v_proj``, ``nn.LayerNorm``; the
component inner products, ``relu``, ``exp(Σ deg·log(x + 1e-24))`` over the official degree
list, ``/ ‖C[remain_pos]‖²``, ``· a``, the softmax over keys — sharing no code with gflow, so
that the test comparing the two checks gflow's Full model against the definition.

Parameters are given in the official layout: ``W`` ``(T, H)``, ``q_proj``, ``k_proj``,
``o_v_proj`` ``(d, d, H)``, LayerNorm ``weight``/``bias`` ``(d,)``, ``C_alpha`` (one row, over
:func:`official_degrees`), ``a``.
"""

from __future__ import annotations

import itertools

import numpy as np


def official_degrees(H: int, D: int) -> np.ndarray:
    """The official degree vectors: ``itertools.product(range(2), repeat=H+1)`` with total
    degree <= D (``low_degree``), in that order; column 0 is the token component."""
    deg = np.array(list(itertools.product(range(2), repeat=H + 1)), np.float64)
    return deg[deg.sum(1) <= D]


def _softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def forward(X, d, W, q_proj, k_proj, o_v_proj, ln_weight, ln_bias, C_alpha, a, D, standard_LN=False):
    """The model's output for token sequences ``X`` ``(bs, T)``: ``(bs, d)`` (a probability vector).
    ``standard_LN``: the selector's normalisation of ``TwoLayerTransformer`` before 2024-08-27
    (``PolyKernelMultiHeadAttention(standard_LN=True)``: by the features' norms, the code of the
    stored Full runs), else the final code's (by ``‖C[remain_pos]‖²``)."""
    bs, T = X.shape
    H = W.shape[1]
    Xoh = np.eye(d)[X]  # (bs, T, d)
    q_k_proj = np.einsum("ijh,kjh->ikh", q_proj, k_proj)
    X_tilde = np.concatenate([Xoh, np.zeros((bs, 1, d))], axis=-2)  # (bs, T+1, d)
    V = X_tilde.copy()
    for h in range(H):
        W_h = np.full((T + 1, T + 1), -np.inf)
        for j in range(H):
            k = j + h + 1
            idx = np.arange(k, T + 1)
            W_h[idx, idx - k] = W[j + h, h]
        W_h[np.arange(T + 1), np.arange(T + 1)] = 1e-6
        attn1 = np.matmul(np.matmul(X_tilde, q_k_proj[:, :, h]), np.transpose(X_tilde, (0, 2, 1))) + W_h
        attn1 = _softmax(attn1, -1)
        v_h = np.matmul(np.matmul(attn1, X_tilde), o_v_proj[:, :, h])
        v_h = _layer_norm(v_h, ln_weight, ln_bias)
        V = np.concatenate([V, v_h], axis=-1)
    q, k, v = V[..., -1:, :], V[..., :-1, :], V[..., :-1, 0:d]
    degrees = official_degrees(H, D)
    remain_pos = np.where(degrees[:, 0] == 0)[0]
    key_new = k.reshape(bs, T, H + 1, d)
    query_new = q.reshape(bs, 1, H + 1, d)
    x = np.einsum("bqcd,bscd->bqsc", query_new, key_new)
    x = np.maximum(x, 0.0)
    x = np.exp(np.einsum("bqsc,lc->bqsl", np.log(x + 1e-24), degrees))
    x = np.einsum("bqsl,hl->bhqs", x, C_alpha**2)
    if standard_LN:
        def norm_prod(z):  # __feature_norm_prod__
            n = np.einsum("bqcd,bqcd->bqc", z, z)
            n = np.exp(np.einsum("bqc,lc->bql", np.log(n + 1e-24), degrees))
            return np.einsum("bql,hl->bhq", n, C_alpha**2)

        norm_key, norm_query = np.sqrt(norm_prod(key_new)), np.sqrt(norm_prod(query_new))
        logits_shift = x / np.maximum(np.einsum("bhq,bhk->bhqk", norm_query, norm_key), 1e-6)
    else:
        logits_shift = x / np.linalg.norm(C_alpha[:, remain_pos], axis=-1, keepdims=True)[:, None] ** 2
    logits = logits_shift * a  # q·k = 0 (the key is zeros_like(key))
    weights = _softmax(logits, -1)  # (bs, 1, 1, T)
    o = np.einsum("bhnm,bmk->bnk", weights, v)  # (bs, 1, d)
    return o[:, 0]


def cross_entropy(o, y):
    """``nn.CrossEntropyLoss`` per sequence on the output ``o`` taken as logits."""
    z = o - o.max(-1, keepdims=True)
    return -(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(-1)))
