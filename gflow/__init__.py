"""gflow: limiting gradient-flow dynamics of a two-layer transformer on n-gram
Markov mixtures (Chen, Sheen, Wang, Yang, NeurIPS 2024).

Importing gflow turns on JAX's float64 (``jax_enable_x64``): the flow is
integrated in float64 by default; ``estimator.dtype = "float32"`` opts out.
"""

import importlib.metadata

import jax

jax.config.update("jax_enable_x64", True)

from .core import AbsoluteModel as AbsoluteModel
from .core import AbstractCSelector as AbstractCSelector
from .core import AbstractModel as AbstractModel
from .core import AbstractOffsetSpan as AbstractOffsetSpan
from .core import AbstractOwnOffsets as AbstractOwnOffsets
from .core import AbstractPaperStages as AbstractPaperStages
from .core import AbstractPositionalModel as AbstractPositionalModel
from .core import AbstractRPECopier as AbstractRPECopier
from .core import AbstractSelectorPositionalModel as AbstractSelectorPositionalModel
from .core import AbstractWindowModel as AbstractWindowModel
from .core import BilinearModel as BilinearModel
from .core import DataConfig as DataConfig
from .core import EdelmanModel as EdelmanModel
from .core import EstimatorConfig as EstimatorConfig
from .core import FullModel as FullModel
from .core import InitConfig as InitConfig
from .core import LinearOutputModel as LinearOutputModel
from .core import LinearQueryModel as LinearQueryModel
from .core import LossStats as LossStats
from .core import ModelConfig as ModelConfig
from .core import NichaniModel as NichaniModel
from .core import PaperModel as PaperModel
from .core import Params as Params
from .core import PopulationLoss as PopulationLoss
from .core import ResidualModel as ResidualModel
from .core import Sample as Sample
from .core import TokenModel as TokenModel
from .core import ValueModel as ValueModel
from .core import init_params as init_params
from .core import make_loss as make_loss
from .core import member_of as member_of
from .core import sample as sample
from .core import stationary_window as stationary_window
from .core import subsets as subsets
from .core import toeplitz_defect as toeplitz_defect
from .core import window_law as window_law

try:
    __version__ = importlib.metadata.version("gflow")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    __version__ = "0.0.0"

from .checks import Report as Report
from .checks import Row as Row
from .checks import check as check
from .config import Config as Config
from .config import load_config as load_config
from .dynamics import Catapult as Catapult
from .dynamics import DenseSolution as DenseSolution
from .dynamics import EdgeStates as EdgeStates
from .dynamics import FlowError as FlowError
from .dynamics import SDEConfig as SDEConfig
from .dynamics import SGDConfig as SGDConfig
from .dynamics import SGDRun as SGDRun
from .dynamics import Sharpness as Sharpness
from .dynamics import Spectrum as Spectrum
from .dynamics import catapult_map as catapult_map
from .dynamics import central_predictions as central_predictions
from .dynamics import dense_solution as dense_solution
from .dynamics import find_catapults as find_catapults
from .dynamics import hessian_spectrum as hessian_spectrum
from .dynamics import loss_hessian as loss_hessian
from .dynamics import sde as sde
from .dynamics import sgd as sgd
from .dynamics import sharpness as sharpness
from .dynamics import solve_sdcp as solve_sdcp
from .runs import EvalResult as EvalResult
from .runs import GridIncomplete as GridIncomplete
from .runs import LimitResult as LimitResult
from .runs import PhaseResult as PhaseResult
from .runs import Replicates as Replicates
from .runs import SweepResult as SweepResult
from .runs import attention as attention
from .runs import check_run as check_run
from .runs import evaluate as evaluate
from .runs import integrate as integrate
from .runs import integrate_batch as integrate_batch
from .runs import merge_shards as merge_shards
from .runs import plot_run as plot_run
from .runs import probes as probes
from .runs import run_limit as run_limit
from .runs import run_phase as run_phase
from .runs import run_replicates as run_replicates
from .runs import run_sweep as run_sweep
from .runs import strategies as strategies
from .theory import ChiSquaredRanking as ChiSquaredRanking
from .theory import Ladder as Ladder
from .theory import Stage1Duration as Stage1Duration
from .theory import StageIIILaw as StageIIILaw
from .theory import StageIRates as StageIRates
from .theory import Theory as Theory
from .theory import format_theory as format_theory
from .theory import graph_chi2_mi as graph_chi2_mi
from .theory import loss_ladder as loss_ladder
from .theory import theory_report as theory_report
from .trajectory import RunFolderError as RunFolderError
from .trajectory import StageRecord as StageRecord
from .trajectory import Trajectory as Trajectory
from .trajectory import load as load
