"""The house: gflow's subpackages form layers, each importing only from the layers below it,
across subpackages only through a subpackage's ``__init__``, with no import cycle (imports
inside functions counted) and no private name imported from another module. The numerical
layers write no files, and only the figures layer imports matplotlib.

The rules are read from the source with ``ast`` (nothing is imported), so a violation fails
with the offending import named."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gflow

PKG = Path(gflow.__file__).resolve().parent

# Bottom to top. A module may import from its own layer only inside its own subpackage.
LAYERS = [
    ("gflow._util",),
    ("gflow.core",),
    ("gflow.config",),
    ("gflow.trajectory",),
    ("gflow.dynamics",),
    ("gflow.theory",),
    ("gflow.checks",),
    ("gflow.figures",),
    ("gflow.runs",),
    ("gflow.cli",),
    ("gflow.__main__", "gflow"),
]
SUBPACKAGES = (
    "gflow._util", "gflow.core", "gflow.config", "gflow.dynamics", "gflow.theory", "gflow.checks", "gflow.figures", "gflow.runs",
    "gflow.cli",
)
NO_FILES = ("gflow.core", "gflow.dynamics", "gflow.theory", "gflow.checks")
# What writes or removes a file or a folder: functions called by name, methods of any object,
# and functions of the modules that write (``os.replace``, ``np.save``, ``shutil.rmtree``).
# A hook object's ``save`` (the run layer's folder, ``out.save(traj)``) is not among them.
WRITER_FUNCTIONS = {"atomic_write_text", "atomic_write_json", "atomic_write_npz", "remove_temporaries", "save"}
WRITER_METHODS = {"savefig", "mkdir", "makedirs", "unlink", "rmtree", "write_text", "write_bytes", "touch"}
WRITER_MODULES = {"os", "shutil", "np", "numpy", "pathlib"}


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        out[name] = (p, ast.parse(p.read_text()))
    return out


MODULES = _modules()


def _target(mod: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    parts = pkg.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))


def _imports(mod: str):
    """(imported module, name or None, line) for every gflow import of `mod`, at any depth."""
    path, tree = MODULES[mod]
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            tgt = _target(mod, path, n)
            if tgt == "gflow" or tgt.startswith("gflow."):
                for a in n.names:
                    sub = f"{tgt}.{a.name}"
                    yield (sub, None, n.lineno) if sub in MODULES else (tgt, a.name, n.lineno)
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.startswith("gflow"):
                    yield a.name, None, n.lineno


def _find_layer(mod: str) -> int | None:
    for i, names in enumerate(LAYERS):
        for top in names:
            if mod == top or (top != "gflow" and mod.startswith(top + ".")):
                return i
    return None


def _layer(mod: str) -> int:
    i = _find_layer(mod)
    if i is None:
        raise AssertionError(f"{mod} belongs to no layer: add it to LAYERS")
    return i


def _subpackage(mod: str) -> str | None:
    return next((s for s in SUBPACKAGES if mod == s or mod.startswith(s + ".")), None)


def test_every_module_has_a_layer():
    """Every module of the package sits in one of LAYERS (a new module must be placed)."""
    homeless = [mod for mod in MODULES if _find_layer(mod) is None]
    assert not homeless, f"{homeless} belong to no layer: add them to LAYERS"
    assert len(MODULES) > len(LAYERS)  # the walk found the package's modules


def test_layers_import_only_downwards_and_through_init():
    bad = []
    for mod in MODULES:
        me, mine = _layer(mod), _subpackage(mod)
        for tgt, _, line in _imports(mod):
            where = f"{MODULES[mod][0].relative_to(PKG.parent)}:{line} imports {tgt}"
            if mod == "gflow" or tgt == mod:
                continue
            if tgt == "gflow":
                bad.append(f"{where}: import from the package's top, which imports everything")
                continue
            them, theirs = _layer(tgt), _subpackage(tgt)
            if them > me or (them == me and mine != theirs):
                bad.append(f"{where}: layer {LAYERS[them][0]} is not below {LAYERS[me][0]}")
            elif theirs is not None and theirs != mine and tgt != theirs:
                bad.append(f"{where}: across subpackages only through {theirs}'s __init__")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    edges = {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}
    # a subpackage's __init__ is part of every import of it; the top-level gflow is the root
    edges["gflow"] = set()
    state, stack, cycles = {}, [], []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                cycles.append(stack[stack.index(w):] + [w])
            elif w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in sorted(MODULES):
        if v not in state:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_private_name_across_modules():
    bad = [
        f"{MODULES[mod][0].relative_to(PKG.parent)}:{line} imports {name} from {tgt}"
        for mod in MODULES
        for tgt, name, line in _imports(mod)
        if name is not None and name.startswith("_") and not name.startswith("__") and tgt != mod
    ]
    assert not bad, "\n".join(bad)


def _writes(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        if f.id in WRITER_FUNCTIONS:
            return f.id
        if f.id == "open":
            args = [*call.args[1:2], *[k.value for k in call.keywords if k.arg == "mode"]]
            mode = args[0].value if args and isinstance(args[0], ast.Constant) else "r"
            return f"open(mode={mode!r})" if set(mode) & set("wax+") else None
    elif isinstance(f, ast.Attribute):
        if f.attr in WRITER_METHODS:
            return f.attr
        if isinstance(f.value, ast.Name) and f.value.id in WRITER_MODULES and f.attr not in ("path", "environ"):
            if f.attr in ("replace", "rename", "remove", "rmdir", "save", "savez", "savez_compressed", "copy", "copytree",
                          "move", "rmtree", "makedirs", "mkdir", "unlink", "write"):  # fmt: skip
                return f"{f.value.id}.{f.attr}"
    return None


def test_numerical_layers_write_no_files():
    bad = []
    for mod, (path, tree) in MODULES.items():
        if _subpackage(mod) not in NO_FILES:
            continue
        for n in ast.walk(tree):
            what = _writes(n) if isinstance(n, ast.Call) else None
            if what is not None:
                bad.append(f"{path.relative_to(PKG.parent)}:{n.lineno} calls {what}")
    assert not bad, "\n".join(bad)


def test_only_figures_import_matplotlib():
    bad = []
    for mod, (path, tree) in MODULES.items():
        if _subpackage(mod) == "gflow.figures":
            continue
        for n in ast.walk(tree):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""] if isinstance(n, ast.ImportFrom) else []
            if any(x == "matplotlib" or x.startswith("matplotlib.") for x in names):
                bad.append(f"{path.relative_to(PKG.parent)}:{n.lineno}")
    assert not bad, "matplotlib imported outside gflow.figures: " + ", ".join(bad)


# The one deliberate write into another library's module state: the command line (and only
# it, while `main` runs; it restores the value when it returns) traces equinox's runtime checks
# in "nan" mode, so that the stage solves carry no host callback and can be cached on disk.
# equinox reads EQX_ON_ERROR from the environment when it is imported, i.e. before gflow.cli
# can run; setting the variable would need a second interpreter.
# A grid's worker (gflow/runs/_executor.py) takes the coordinating process's value of it, for
# the duration of a point, so that its programs are the coordinator's.
ALLOWED_FOREIGN_WRITES = {("gflow/cli/_session.py", "_errors.EQX_ON_ERROR"),
                          ("gflow/runs/_executor.py", "_errors.EQX_ON_ERROR")}  # fmt: skip


def test_no_writes_into_other_libraries_state():
    """No ``module.attr = …`` on a module imported from another library (nor ``setattr`` on it),
    except :data:`ALLOWED_FOREIGN_WRITES`."""
    bad = []
    for mod, (path, tree) in MODULES.items():
        foreign = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                foreign |= {(a.asname or a.name).split(".")[0] for a in n.names if not a.name.startswith("gflow")}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and not (n.module or "").startswith("gflow"):
                foreign |= {a.asname or a.name for a in n.names}
        rel = path.relative_to(PKG.parent).as_posix()
        for n in ast.walk(tree):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            hits = [f"{t.value.id}.{t.attr}" for t in targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in foreign]  # fmt: skip
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr" and n.args \
                    and isinstance(n.args[0], ast.Name) and n.args[0].id in foreign:  # fmt: skip
                hits.append(f"setattr({n.args[0].id}, ...)")
            bad += [f"{rel}:{n.lineno} sets {h}" for h in hits if (rel, h) not in ALLOWED_FOREIGN_WRITES]
    assert not bad, "\n".join(bad)


def test_importing_gflow_leaves_other_libraries_alone():
    """A fresh interpreter: importing gflow switches on float64 (documented) and changes no
    equinox setting, no matplotlib backend, no environment variable."""
    code = (
        "import os, json; env = dict(os.environ)\n"
        "import equinox._errors as E; before = getattr(E, 'EQX_ON_ERROR', None)\n"
        "import gflow, jax, sys\n"
        "print(json.dumps([before == getattr(E, 'EQX_ON_ERROR', None), env == dict(os.environ),"
        " 'matplotlib.pyplot' in sys.modules, jax.config.jax_enable_x64]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[true, true, false, true]"


# Every name users import from gflow today (the public surface); a rename is a failing test.
PUBLIC = """
DataConfig EstimatorConfig FlowError InitConfig LossStats ModelConfig Params PopulationLoss Report
SDEConfig SGDConfig SGDRun Sample Theory Trajectory check check_run evaluate format_theory init_params
integrate integrate_batch load load_config loss_ladder make_loss merge_shards plot_run run_phase
run_replicates run_sweep sample sde sgd stationary_window subsets theory_report window_law Config
StageIIILaw ChiSquaredRanking StageIRates Stage1Duration Ladder StageRecord RunFolderError Row EvalResult
SweepResult PhaseResult Replicates __version__
member_of AbstractModel AbstractWindowModel PaperModel TokenModel ValueModel FullModel AbsoluteModel
ResidualModel LinearQueryModel LinearOutputModel BilinearModel toeplitz_defect
""".split()


def test_public_names():
    missing = [n for n in PUBLIC if not hasattr(gflow, n)]
    assert not missing, missing


# The rooms of scripts/ (docs/architecture.md, "Outside the package"): nothing else at its top.
SCRIPT_ROOMS = {"benchmarks", "studies", "configs"}
MAX_LINES = 700


def test_scripts_have_a_room_each():
    top = PKG.parent / "scripts"
    assert {p.name for p in top.iterdir() if not p.name.startswith(".")} == SCRIPT_ROOMS
    assert all(p.suffix == ".toml" for p in (top / "configs").iterdir())
    assert all(p.suffix == ".py" for room in ("benchmarks", "studies") for p in (top / room).iterdir() if p.is_file())


def test_no_module_over_700_lines():
    long = {str(p.relative_to(PKG.parent)): n for p, _ in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_members_never_override_a_concrete_method():
    """Equinox's abstract/final pattern in the model family: a method an abstract class implements
    (the shared pieces of gflow/core/_traits.py, the layouts' classes, AbstractModel's own) is never
    redefined by a class below it, and every member is final (no member subclasses another). So a
    member's module holds only what makes it different."""
    import inspect

    from gflow.core._registry import MEMBERS

    bad = []
    for name, cls in MEMBERS.items():
        for base in cls.__mro__[1:]:
            if base is object or not base.__name__.startswith("Abstract"):
                continue
            abstract = getattr(base, "__abstractmethods__", frozenset())
            for attr, val in vars(base).items():
                if attr.startswith("__") or attr in abstract or getattr(val, "__isabstractmethod__", False):
                    continue
                if not (inspect.isfunction(val) or isinstance(val, property)):
                    continue
                for below in cls.__mro__[: cls.__mro__.index(base)]:
                    if attr in vars(below):
                        bad.append(f"{below.__name__}.{attr} overrides {base.__name__}.{attr}")
        assert not any(issubclass(cls, other) for o, other in MEMBERS.items() if o != name), name
    assert not bad, sorted(set(bad))
