# %% [markdown]
# # Replicate bands: how much of a trajectory is Monte Carlo noise?
#
# The flow is integrated on one fixed sample of N sequences (common random numbers,
# [§M5](../theory/mathematics.md#M5)), so a trajectory carries the sample's Monte Carlo
# error. `gflow.run_replicates` integrates R independent samples (replicate r uses
# `estimator.seed = seed + r`, vmapped together) and returns their bands: per stage, on
# the stage's own clock τ, the mean and spread of $c_S/\sum c$, $s$, $a$ and the loss.
# (`gflow run --replicates R` does the same from the command line.)
#
# Tiny size: R = 3 at L = 20, N = 200. Full size: R = 8 at L = 40, N = 2,000.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import gflow

TINY = os.environ.get("GFLOW_EXAMPLE_SIZE") == "tiny"
R = 3 if TINY else 8
cfg = gflow.Config().replace(data={"L": 20 if TINY else 40}, estimator={"N": 200 if TINY else 2000})
reps = gflow.run_replicates(cfg, R, out="reps")
for name, band in reps.bands.items():
    print(f"Stage {name}: {len(band.tau)} grid points; stage lengths {np.round(band.length, 3)}; "
          f"ended by {band.ended_by}; selected {band.selected}")

assert len(reps.trajectories) == R and all(t.status == "complete" for t in reps.trajectories)
assert len({tuple(t.stages[1].selected) for t in reps.trajectories}) == 1  # every replicate selects the same set

# %% [markdown]
# The bands of $a$ in Stage III and of the selected set's weight in Stage I, mean ± one
# standard deviation over the replicates (`band.mean`, `band.std`; `band.values` holds
# every replicate on the common grid, NaN once its stage has ended):

# %%
III, I = reps.bands["III"], reps.bands["I"]
k = reps.trajectories[0].subsets.index(tuple(reps.trajectories[0].stages[1].selected))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
for band, ax, q, col, title in ((I, ax1, "c_frac", k, "Stage I: selected set's c_S/Σc"), (III, ax2, "a", None, "Stage III: a")):
    m, s = band.mean[q], band.std[q]
    if col is not None:
        m, s = m[:, col], s[:, col]
    tau = band.tau
    ax.semilogx(tau[1:], m[1:], color="C0", label=f"mean of {R} replicates")
    ax.fill_between(tau[1:], (m - s)[1:], (m + s)[1:], color="C0", alpha=0.3, label="± 1 sd")
    ax.set(xlabel="τ (the stage's own clock)", title=title)
    ax.legend(fontsize=8)
fig.tight_layout()

a_end = III.end["a"]
print(f"a at the end of Stage III: {np.mean(a_end):.4f} ± {np.std(a_end, ddof=1):.4f} (sd over {R} samples)")
assert np.all(np.isfinite(a_end)) and np.std(a_end, ddof=1) > 0  # different samples, different a*
