"""Compare the resource preflight's memory estimate (gflow.runs.estimate_memory) with the measured peak
resident memory of building the loss and taking one gradient and the loss statistics, each
configuration in a fresh process (peak RSS minus the RSS after importing gflow and a warm-up).

    python scripts/benchmarks/preflight_calibrate.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = [
    {},
    {"estimator": {"N": 100_000}},
    {"data": {"L": 200}, "model": {"M": 6}, "estimator": {"N": 20_000}},
    {"data": {"parents": [1, 2, 3, 4]}, "estimator": {"N": 20_000}},
]

CHILD = r"""
import json, resource, sys
import jax, jax.numpy as jnp
import gflow
from gflow.core import init_params
from gflow.runs import estimate_memory
jnp.ones(3).sum().block_until_ready()
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
base = rss()
cfg = gflow.config.from_dict(json.loads(sys.argv[1]))
loss = gflow.make_loss(cfg.data, cfg.model, cfg.estimator)
p = init_params(cfg.model, cfg.init)
jax.block_until_ready(loss.value_and_grad(p))
jax.block_until_ready(loss.stats(p))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
est = sum(x.bytes for x in estimate_memory(cfg))
print(json.dumps({"estimate": est, "measured": peak - base}))
"""


def main() -> None:
    for case in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], capture_output=True, text=True)
        if out.returncode:
            print(case, "failed:", out.stderr.strip().splitlines()[-1])
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{json.dumps(case):70s} estimate {r['estimate'] / 1e9:7.3f} GB  measured {r['measured'] / 1e9:7.3f} GB  "
              f"ratio {r['estimate'] / max(r['measured'], 1):.2f}")


if __name__ == "__main__":
    main()
