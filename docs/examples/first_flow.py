# %% [markdown]
# # A first flow: labelled selector weights and the GIH law
#
# Integrate the paper's staged gradient flow, read the selector weights $c_S/\sum c$ by
# parent set, and put $a(t)$ beside the law of the generalized induction head (GIH):
# its fixed point $a^*$, its rate constant $C^* = \max_a F(a)e^a$ and the validity window
# $\{a : F(a)e^a \ge C^*/2\}$ where $a(t)$ follows $\log t$
# ([§M6.4](../theory/mathematics.md#M6.4)).
#
# `GFLOW_EXAMPLE_SIZE=tiny` runs it in seconds (L = 20, N = 200); the full size is the
# paper's default (L = 100, N = 10,000; about a minute on 2 cores).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import gflow

TINY = os.environ.get("GFLOW_EXAMPLE_SIZE") == "tiny"
cfg = gflow.Config().replace(data={"L": 20}, estimator={"N": 200}) if TINY else gflow.Config()
traj = gflow.integrate(cfg)
theory = gflow.theory_report(cfg.data, cfg.model, cfg.estimator, cfg.init, n_pi=300 if TINY else 2000)

# %% [markdown]
# The columns of `traj.c_frac` are the parent sets `traj.labels`; each stage ended by its
# event (I, II) or its duration (III):

# %%
for label, weight in zip(traj.labels, traj.c_frac[-1]):
    print(f"{label:>6}  c_S/Σc = {weight:.5f}")
for st in traj.stages:
    print(f"Stage {st.name}: t = {st.t0:.4g} -> {st.t1:.4g}, ended by {st.ended_by}, {st.steps} steps")
selected = traj.subsets[int(np.argmax(traj.c_frac[-1]))]
print("selected", selected, "  S* = argmax Ĩ:", theory.S_star, "  argmax J:", theory.argmax_J)

assert np.allclose(traj.c_frac.sum(axis=1), 1.0)
assert selected == theory.argmax_J  # at finite size Stage I follows J

# %% [markdown]
# Stage III moves only $a$. On its own clock $\tau = t - t_0$ it climbs like $\log\tau$
# through the window and settles at the fixed point $a^*$ of the selected set's GIH:

# %%
law = theory.laws[selected]
III = traj.stage == 3
tau, a = traj.ts[III] - traj.ts[III][0], traj.a[III]
print(f"a at the end {a[-1]:.4f};  GIH: a* = {law.a_star:.4f} ± {law.a_star_se:.4f}, C* = {law.C_star:.4f}, "
      f"window = ({law.window[0]:.3f}, {law.window[1]:.3f})")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
for k, label in enumerate(traj.labels):
    ax1.semilogx(traj.ts[1:], traj.c_frac[1:, k], label=label, lw=2.5 if traj.subsets[k] == selected else 1)
ax1.set(xlabel="t", ylabel="c_S / Σc", title="selector weights")
ax1.legend(fontsize=8)
ax2.semilogx(tau[1:], a[1:], label="a(τ), the flow")
ax2.axhline(law.a_star, ls="--", color="k", label="a* (GIH)")
ax2.axhspan(*law.window, color="C1", alpha=0.2, label="validity window")
ax2.set(xlabel="τ = t − t₀ (Stage III)", ylabel="a", title="classifier scale")
ax2.legend(fontsize=8)
fig.tight_layout()

assert np.all(np.diff(a) > -1e-6)  # a only grows in Stage III (to the solver's tolerance)
assert abs(a[-1] - law.a_star) < 0.2 * law.a_star  # it settles near a* (the copier is nearly one-hot)
