"""gflow: limiting gradient-flow dynamics of a two-layer transformer on n-gram
Markov mixtures (Chen, Sheen, Wang, Yang, NeurIPS 2024).

Importing gflow turns on JAX's float64 (``jax_enable_x64``): the flow is
integrated in float64 by default; ``estimator.dtype = "float32"`` opts out.
"""

import importlib.metadata

import jax

jax.config.update("jax_enable_x64", True)

from .data import DataConfig as DataConfig
from .data import Sample as Sample
from .data import sample as sample
from .data import stationary_window as stationary_window
from .data import window_law as window_law
from .loss import EstimatorConfig as EstimatorConfig
from .loss import LossStats as LossStats
from .loss import PopulationLoss as PopulationLoss
from .loss import make_loss as make_loss
from .model import InitConfig as InitConfig
from .model import ModelConfig as ModelConfig
from .model import Params as Params
from .model import init_params as init_params
from .model import subsets as subsets

try:
    __version__ = importlib.metadata.version("gflow")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"

from ._evaluate import evaluate as evaluate
from .checks import Report as Report
from .checks import check as check
from .checks import check_run as check_run
from .config import Config as Config
from .config import load_config as load_config
from .flow import FlowError as FlowError
from .flow import integrate as integrate
from .ladder import loss_ladder as loss_ladder
from .replicates import run_replicates as run_replicates
from .sde import SDEConfig as SDEConfig
from .sde import sde as sde
from .sgd import SGDConfig as SGDConfig
from .sgd import SGDRun as SGDRun
from .sgd import sgd as sgd
from .theory import Theory as Theory
from .theory import format_theory as format_theory
from .theory import theory_report as theory_report
from .trajectory import Trajectory as Trajectory
from .trajectory import load as load
from .vmapped import integrate_batch as integrate_batch
