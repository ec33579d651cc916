"""The solves: the stage loop of the paper's gradient flow and the joint flow
(``_flow``, ``_solve``), replicates integrated at once (``_vmapped``), online SGD
(``_sgd``) and its diffusion limit (``_sde``), the two as runs with a seed axis
(``_stochastic``).

Layer rule: imports ``_util``, ``core``, ``gflow.config`` and ``gflow.trajectory``;
hands every saved snapshot to an ``on_save`` hook instead of writing files itself.
"""

from ._catapult import Catapult as Catapult
from ._catapult import catapult_map as catapult_map
from ._catapult import find_catapults as find_catapults
from ._central import EDGE_RATE as EDGE_RATE
from ._central import EDGE_WINDOW as EDGE_WINDOW
from ._central import SDCP_TOL as SDCP_TOL
from ._central import EdgeStates as EdgeStates
from ._central import solve_sdcp as solve_sdcp
from ._dense import DenseSolution as DenseSolution
from ._dense import dense_solution as dense_solution
from ._edge import central_predictions as central_predictions
from ._flow import FlowError as FlowError
from ._flow import integrate as integrate
from ._resume import check_resumable as check_resumable
from ._sde import SDEConfig as SDEConfig
from ._sde import sde as sde
from ._sde import sde_settings as sde_settings
from ._sgd import SGDConfig as SGDConfig
from ._sgd import SGDRun as SGDRun
from ._sgd import sgd as sgd
from ._sgd import sgd_settings as sgd_settings
from ._solve import LogC as LogC
from ._solve import VectorField as VectorField
from ._solve import block_scales as block_scales
from ._spectrum import LANCZOS_STEPS as LANCZOS_STEPS
from ._spectrum import Sharpness as Sharpness
from ._spectrum import Spectrum as Spectrum
from ._spectrum import coordinate_labels as coordinate_labels
from ._spectrum import hessian_spectrum as hessian_spectrum
from ._spectrum import loss_hessian as loss_hessian
from ._spectrum import sharpness as sharpness
from ._spectrum import step_scales as step_scales
from ._stochastic import check_stochastic as check_stochastic
from ._stochastic import integrate_stochastic as integrate_stochastic
from ._stochastic import stochastic_trajectory as stochastic_trajectory
from ._vmapped import integrate_batch_with_errors as integrate_batch_with_errors
from ._vmapped import sample_bytes as sample_bytes
