"""Predictions from a configuration alone, nothing integrated: the modified
χ²-MI ranking and the Stage I rates (``_stage1``), the generalized induction
head's law (``_gih``), the laws per model (``_laws``), the loss ladder
(``_ladder``), the typed result (``_result``), its text (``_text``) and
:func:`theory_report` (``_theory``).

Layer rule: imports ``_util``, ``core`` and ``gflow.config``; writes no files.
"""

from ._gih import GIH as GIH
from ._gih import StageIIILaw as StageIIILaw
from ._gih import gih_counts as gih_counts
from ._gih import gih_dforce as gih_dforce
from ._gih import gih_force as gih_force
from ._gih import gih_force_per_seq as gih_force_per_seq
from ._gih import gih_ode as gih_ode
from ._gih import limit_loss as limit_loss
from ._gih import make_gih as make_gih
from ._gih import set_gih as set_gih
from ._gih import stage3_law as stage3_law
from ._graph import graph_chi2_mi as graph_chi2_mi
from ._ladder import RUNGS as RUNGS
from ._ladder import STRATEGY_RUNGS as STRATEGY_RUNGS
from ._ladder import Ladder as Ladder
from ._ladder import format_ladder as format_ladder
from ._ladder import loss_ladder as loss_ladder
from ._lawcurve import LawCurve as LawCurve
from ._laws import copier_vertex_gradient as copier_vertex_gradient
from ._laws import gih_tail as gih_tail
from ._laws import predict_selection as predict_selection
from ._laws import stage1_rates_exact as stage1_rates_exact
from ._laws import stage1_rates_small_a as stage1_rates_small_a
from ._probes import PROBES as PROBES
from ._probes import probes_of as probes_of
from ._result import LAW_COVERAGE as LAW_COVERAGE
from ._result import ChiSquaredRanking as ChiSquaredRanking
from ._result import Stage1Duration as Stage1Duration
from ._result import StageIRates as StageIRates
from ._result import Theory as Theory
from ._result import config_key as config_key
from ._result import covers as covers
from ._stage1 import TIE_RTOL as TIE_RTOL
from ._stage1 import chi2_mi as chi2_mi
from ._stage1 import modified_chi2_ranking as modified_chi2_ranking
from ._stage1 import mutual_information as mutual_information
from ._stage1 import predicted_stage1_duration as predicted_stage1_duration
from ._stage1 import ranking_of_sets as ranking_of_sets
from ._stage1 import stage1_rates as stage1_rates
from ._stage1 import unrepresented_parents as unrepresented_parents
from ._strategies import STRATEGIES as STRATEGIES
from ._strategies import model_predictions as model_predictions
from ._strategies import score_probs as score_probs
from ._strategies import strategies_along as strategies_along
from ._strategies import strategies_of as strategies_of
from ._strategies import strategy_arrays as strategy_arrays
from ._strategies import strategy_kl as strategy_kl
from ._strategies import strategy_losses as strategy_losses
from ._strategies import strategy_phases as strategy_phases
from ._strategies import strategy_predictions as strategy_predictions
from ._text import format_theory as format_theory
from ._text import rate_symbol as rate_symbol
from ._theory import theory_report as theory_report
