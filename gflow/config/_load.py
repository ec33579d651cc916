"""Reading a configuration file (:func:`load_config`), and the warnings and refusals about valid
configurations."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ._sections import METHODS, STOCHASTIC_METHODS, Config, from_dict

# Below this many sequences the Monte Carlo standard errors mean little: the estimated standard
# deviation s has a relative sampling error of about 1/sqrt(2(N-1)) (> 7 % for N < 100, Gaussian
# per-sequence values; more for the heavy-tailed log losses), and the checks read |x − theory| <= k·se
# as a confidence statement, which needs the central limit theorem to hold for the sample mean.
N_WARN = 100


def refuse_sgd(cfg: Config, what: str) -> None:
    """``ValueError`` if ``cfg`` asks for a stochastic method (``solver.method = "sgd"`` or
    ``"sde"``), which `what` (a flow integrator) cannot run: R seeds are not one trajectory."""
    m = cfg.solver.method_for("I")
    if m in STOCHASTIC_METHODS:
        raise ValueError(
            f"solver.method = {m!r} runs R seeds (sgd.seeds), not one flow: {what} integrates flows "
            f"(solver.method one of {tuple(x for x in METHODS if x not in STOCHASTIC_METHODS)}); run it with "
            f"`gflow run CONFIG --out DIR` or gflow.integrate(config), which write a trajectory with a seed axis"
        )


def warnings_for(cfg: Config) -> list[str]:
    """Warnings about a configuration that is valid but degenerate (printed by ``gflow run``)."""
    out = []
    if cfg.estimator.N < N_WARN:
        out.append(
            f"estimator.N = {cfg.estimator.N} < {N_WARN}: the Monte Carlo standard errors (and the checks built "
            f"on them) are not meaningful; the flow is that of a {cfg.estimator.N}-sequence sample"
        )
    return out


def load_config(path: str | Path | None) -> Config:
    """Read a TOML configuration (``None``: the paper's default)."""
    if path is None:
        return Config()
    path = Path(path)
    what = not_a_file(path)
    if what is not None:
        raise ValueError(f"config file {str(path)!r} {what}: a configuration is a TOML file")
    try:
        with open(path, "rb") as f:
            d = tomllib.load(f)
    except RecursionError:
        raise ValueError(f"config file {str(path)!r} nests arrays or tables too deeply to be a configuration") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(
            f"config file {str(path)!r} is not a text (UTF-8) TOML file: {e.reason} at byte {e.start}"
        ) from None
    except OSError as e:
        raise ValueError(f"config file {str(path)!r} cannot be read: {e.strerror}") from None
    return from_dict(d)


def not_a_file(path: Path) -> str | None:
    """What `path` is when it is not a readable regular file or a pipe (``None`` when it is)."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):  # a pipe: `gflow run <(…)` reads it once
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISCHR(mode):
        return "is a character device (like /dev/null), not a file"
    if stat.S_ISBLK(mode):
        return "is a block device, not a file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    return "is not a regular file"
