"""Run folders: replicates and their bands (``_replicates``, ``_bands``), sweeps
(``_sweep``), phase grids (``_phase``), the paper's limits by finite-size scaling (``_limit``), the evaluation of a trained θ on other
data (``_evaluate``), and the executors that run a grid's points elsewhere (``_executor``).

Layer rule: the top of the library; the only layer that owns folders, locks and
caches. Only the command line (``gflow.cli``) and ``gflow/__init__`` import it.
"""

from ._evaluate import EvalResult as EvalResult
from ._evaluate import evaluate as evaluate
from ._executor import EXECUTOR_FORMS as EXECUTOR_FORMS
from ._executor import GridIncomplete as GridIncomplete
from ._executor import check_executor as check_executor
from ._folder import RunFolder as RunFolder
from ._folder import TheoryAhead as TheoryAhead
from ._folder import check_output as check_output
from ._folder import check_run as check_run
from ._folder import integrate as integrate
from ._folder import integrate_batch as integrate_batch
from ._folder import integrate_batch_with_errors as integrate_batch_with_errors
from ._folder import load_or_compute as load_or_compute
from ._folder import lock as lock
from ._folder import plot_run as plot_run
from ._folder import save_theory as save_theory
from ._folder import theory_digest as theory_digest
from ._limit import LimitResult as LimitResult
from ._limit import limit_grid as limit_grid
from ._limit import load_limit as load_limit
from ._limit import run_limit as run_limit
from ._phase import PhaseResult as PhaseResult
from ._phase import merge_shards as merge_shards
from ._phase import run_phase as run_phase
from ._preflight import ResourceError as ResourceError
from ._preflight import estimate_memory as estimate_memory
from ._preflight import fmt_bytes as fmt_bytes
from ._preflight import preflight as preflight
from ._read import attention as attention
from ._read import probes as probes
from ._read import strategies as strategies
from ._replicates import Replicates as Replicates
from ._replicates import default_batch as default_batch
from ._replicates import run_replicates as run_replicates
from ._spectrum import SPECTRUM_TIMES as SPECTRUM_TIMES
from ._spectrum import run_spectrum as run_spectrum
from ._spectrum import saved_spectrum as saved_spectrum
from ._sweep import SweepResult as SweepResult
from ._sweep import parse_param as parse_param
from ._sweep import run_sweep as run_sweep
from ._sweep import sweep_points as sweep_points
