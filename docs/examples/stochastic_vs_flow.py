# %% [markdown]
# # GD, SGD and the SDE against the flow
#
# The gradient flow is the small-step limit of training. Three discrete or noisy
# versions of it, on the joint schedule (every block moves at once,
# [§M4](../theory/mathematics.md#M4), [§M8.6](../theory/mathematics.md#M8.6)):
#
# - **GD**, `solver.method = "gd"`: $\theta_{k+1} = \theta_k - \eta\Lambda\nabla\hat L_N(\theta_k)$
#   on the flow's own sample, at $t = k\eta$;
# - **online SGD**, `gflow.sgd`: the same step with the gradient of B fresh sequences;
# - **the SDE**, `gflow.sde`: the stochastic modified equation
#   $d\theta = -\Lambda\nabla\hat L\,dt + \sqrt{\eta/B}\,\Lambda\Sigma(\theta)^{1/2}dW$,
#   with Σ the covariance of the per-sequence gradients.
#
# Tiny size: L = 20, N = 200, t ≤ 5, 4 seeds. Full size: L = 40, N = 1,000, t ≤ 50, 8 seeds.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import gflow

TINY = os.environ.get("GFLOW_EXAMPLE_SIZE") == "tiny"
t1, eta, B, R = (5.0, 0.05, 20, 4) if TINY else (50.0, 0.05, 50, 8)
cfg = gflow.Config().replace(
    data={"L": 20 if TINY else 40},
    estimator={"N": 200 if TINY else 1000},
    schedule={"kind": "joint", "t1": t1},
)
flow = gflow.integrate(cfg)
gd = gflow.integrate(cfg.replace(solver={"method": "gd", "eta": eta}))
steps = int(round(t1 / eta))
sgd = gflow.sgd(cfg, gflow.SGDConfig(eta=eta, batch=B, steps=steps, seeds=R), progress=True)
sde = gflow.sde(cfg, gflow.SDEConfig(eta=eta, batch=B, t1=t1, seeds=R), progress=True)  # bars on stderr

print(f"a at t = {t1:g}:  flow {flow.a[-1]:.4f}   GD (η = {eta}) {gd.a[-1]:.4f}   "
      f"SGD {sgd.a[:, -1].mean():.4f} ± {sgd.a[:, -1].std(ddof=1):.4f}   "
      f"SDE {sde.a[:, -1].mean():.4f} ± {sde.a[:, -1].std(ddof=1):.4f}")
print(f"L̂_N at t = {t1:g}: flow {flow.loss[-1]:.5f}   GD {gd.loss[-1]:.5f}   "
      f"SGD {sgd.loss[:, -1].mean():.5f}   SDE {sde.loss[:, -1].mean():.5f}")

# %% [markdown]
# GD is the flow's explicit Euler scheme: its error is $O(\eta)$. SGD sees fresh
# sequences, so its $a$ differs from the flow's by the Monte Carlo error of the flow's
# fixed sample plus a noise spread $\propto\sqrt{\eta/B}$, which the SDE reproduces in
# order of magnitude ([GD, SGD and the SDE](../guides/stochastic.md)).

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, q in ((ax1, "a"), (ax2, "loss")):
    ax.plot(flow.ts, getattr(flow, q), "k", lw=2, label="flow")
    ax.plot(gd.ts, getattr(gd, q), "C0--", label=f"GD, η = {eta}")
    for run, col, name in ((sgd, "C1", "SGD"), (sde, "C2", "SDE")):
        v = getattr(run, q)
        m, s = v.mean(0), v.std(0, ddof=1)
        ax.plot(run.ts, m, color=col, label=f"{name}, mean of {R}")
        ax.fill_between(run.ts, m - s, m + s, color=col, alpha=0.25)
    ax.set(xlabel="t", title=q if q == "a" else "L̂_N (the fixed sample's loss)")
    ax.legend(fontsize=8)
fig.tight_layout()

assert abs(gd.a[-1] - flow.a[-1]) < 0.05 * abs(flow.a[-1])  # GD ≈ flow at a small step
for run in (sgd, sde):
    assert np.all(run.loss[:, -1] < run.loss[:, 0])  # every seed trains
    assert abs(run.a[:, -1].mean() - flow.a[-1]) < 0.3 * abs(flow.a[-1])
