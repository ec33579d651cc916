"""The paper's objects in pure JAX: the n-gram mixture and its sampler (``_data``), the model
family (``_family``: one abstract class, a final class per member, ``_member_*``; the paper's
TF(M, H, d, D) in ``_paper``), the sample layouts (``_features``), the Monte Carlo population
loss with its gradient and standard errors (``_loss``), and its second derivatives through
the κ table (``_second``).

Layer rule: imports only ``gflow._util``; writes no files, prints nothing.
"""

from ._data import Chain as Chain
from ._data import DataConfig as DataConfig
from ._data import Sample as Sample
from ._data import all_windows as all_windows
from ._data import chain_key as chain_key
from ._data import chain_prefix_stable as chain_prefix_stable
from ._data import chain_steps as chain_steps
from ._data import draw_chain as draw_chain
from ._data import sample as sample
from ._data import sample_fast_time_major as sample_fast_time_major
from ._data import sample_from_chain as sample_from_chain
from ._data import sample_kernels as sample_kernels
from ._data import stationary_window as stationary_window
from ._data import window_law as window_law
from ._family import AbstractModel as AbstractModel
from ._features import LAYOUTS as LAYOUTS
from ._features import CountFeatures as CountFeatures
from ._features import HeadFeatures as HeadFeatures
from ._features import PositionFeatures as PositionFeatures
from ._features import SparseCountFeatures as SparseCountFeatures
from ._features import VectorFeatures as VectorFeatures
from ._features import count_features_flat as count_features_flat
from ._features import features as features
from ._features import features_time_major as features_time_major
from ._kinds import KINDS as KINDS
from ._kinds import AbstractDataKind as AbstractDataKind
from ._kinds import config_codes as config_codes
from ._kinds import dag_parent_sets as dag_parent_sets
from ._kinds import graph_parent_sets as graph_parent_sets
from ._kinds import graph_parents as graph_parents
from ._kinds import kind_of as kind_of
from ._loss import MAX_RELABEL_D as MAX_RELABEL_D
from ._loss import EstimatorConfig as EstimatorConfig
from ._loss import LossStats as LossStats
from ._loss import PopulationLoss as PopulationLoss
from ._loss import StageLoss as StageLoss
from ._loss import check_positions as check_positions
from ._loss import every_position_members as every_position_members
from ._loss import kernel_conditional as kernel_conditional
from ._loss import loss_sample as loss_sample
from ._loss import loss_targets as loss_targets
from ._loss import make_loss as make_loss
from ._loss import mean_se as mean_se
from ._loss import relabel_sample as relabel_sample
from ._loss import resolve_layout as resolve_layout
from ._member_absolute import AbsoluteModel as AbsoluteModel
from ._member_absolute import toeplitz_defect as toeplitz_defect
from ._member_bilinear import BilinearModel as BilinearModel
from ._member_edelman import EdelmanModel as EdelmanModel
from ._member_full import FullModel as FullModel
from ._member_linear_output import LinearOutputModel as LinearOutputModel
from ._member_linear_query import LinearQueryModel as LinearQueryModel
from ._member_nichani import NichaniModel as NichaniModel
from ._member_paper import PaperModel as PaperModel
from ._member_paper import sparse_table_size as sparse_table_size
from ._member_residual import ResidualModel as ResidualModel
from ._member_token import TokenModel as TokenModel
from ._member_value import ValueModel as ValueModel
from ._members import member_of as member_of
from ._members import sequence_attention as sequence_attention
from ._model import BLOCKS as BLOCKS
from ._model import InitConfig as InitConfig
from ._model import ModelConfig as ModelConfig
from ._model import Params as Params
from ._model import flatten as flatten
from ._model import init_params as init_params
from ._model import subset_label as subset_label
from ._model import subsets as subsets
from ._model import unflatten as unflatten
from ._ops import seqmap as seqmap
from ._ops import sequence_loss as sequence_loss
from ._paper import sparse_window_blocks as sparse_window_blocks
from ._paper import window_code_count as window_code_count
from ._paper import window_weights as window_weights
from ._positional import AbstractPositionalModel as AbstractPositionalModel
from ._positional import AbstractSelectorPositionalModel as AbstractSelectorPositionalModel
from ._priors import PRIORS as PRIORS
from ._priors import AbstractPrior as AbstractPrior
from ._priors import prior_of as prior_of
from ._registry import MEMBERS as MEMBERS
from ._second import grad_hvp as grad_hvp
from ._second import has_table as has_table
from ._second import outer_derivatives as outer_derivatives
from ._second import table_hessian as table_hessian
from ._tables import AbstractWindowModel as AbstractWindowModel
