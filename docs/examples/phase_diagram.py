# %% [markdown]
# # A small phase diagram, plotted from `phase.csv` by hand
#
# Where does the paper's Stage I criterion (argmax Ĩ) pick the set the finite-size law
# (argmax J) picks? `run_phase` computes, at every point of a grid over one or two
# configuration fields, the theory's columns ([Phase diagrams](../guides/phase-diagrams.md))
# and writes them to `phase.csv`, one row per point. Here the grid is the initial
# copier's sharpness $w_+$ against the context length $L$, theory only.
#
# Tiny size: 3 × 1 points at N = 200. Full size: 8 × 3 points at N = 2,000.

# %%
import csv
import os

import matplotlib.pyplot as plt
import numpy as np

import gflow

TINY = os.environ.get("GFLOW_EXAMPLE_SIZE") == "tiny"
base = gflow.Config().replace(estimator={"N": 200 if TINY else 2000})
params = ["init.w_plus=lin:1:3:3", "data.L=20"] if TINY else ["init.w_plus=log:0.5:8:8", "data.L=20,40,80"]
res = gflow.run_phase(base, params, "phase", n_pi=200 if TINY else 1000, plot=False)
print(res.table())

# %% [markdown]
# `phase.csv` has the index, the grid's fields, then the theory columns: `S_star`,
# `Itilde_gap`, `Itilde_gap_se`, `Itilde_uncertain`, `argmax_J`, `J_gap`, `J_gap_se`,
# `J_uncertain`, `rankings_agree`, `stage1_duration`, `C_star`, `window_lo`,
# `window_hi`, `a_star`, `limit_loss`, `a_star_S_star`, `limit_loss_S_star`.

# %%
with open("phase/phase.csv", newline="") as f:
    rows = list(csv.DictReader(f))
print(list(rows[0]))
w = np.array([float(r["init.w_plus"]) for r in rows])
L = np.array([int(r["data.L"]) for r in rows])
agree = np.array([r["rankings_agree"] == "True" for r in rows])
winner = [r["argmax_J"] for r in rows]
duration = np.array([float(r["stage1_duration"]) for r in rows])

assert len(rows) == (3 if TINY else 24) and {r["S_star"] for r in rows} == {"{1,2}"}
assert not agree[np.argmin(w)] and agree[np.argmax(w)]  # a blurred copier: J picks another set

# %% [markdown]
# The winner under J at each point (filled where it agrees with Ĩ), and the predicted
# Stage I duration: near the boundary the two leading rates nearly tie and Stage I is slow.

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
sets = sorted(set(winner))
for k, S in enumerate(sets):
    m = np.array([x == S for x in winner])
    ax1.scatter(w[m & agree], L[m & agree], color=f"C{k}", s=80, label=f"argmax J = {S} (= S*)")
    ax1.scatter(w[m & ~agree], L[m & ~agree], facecolor="none", edgecolor=f"C{k}", s=80, label=f"argmax J = {S} ≠ S*")
ax1.set(xscale="log", xlabel="w₊ (initial copier)", ylabel="L", title="Stage I winner")
ax1.legend(fontsize=8)
for Lv in sorted(set(L)):
    m = L == Lv
    ax2.loglog(w[m], duration[m], "o-", label=f"L = {Lv}")
ax2.set(xlabel="w₊", ylabel="predicted Stage I duration", title="linearised Stage I")
ax2.legend(fontsize=8)
fig.tight_layout()
