"""Run configuration: data, model, initialisation, schedule, solver, estimator, and the
stochastic runs' ``[sgd]`` and ``[sde]`` sections (read only by ``solver.method = "sgd"``
or ``"sde"``).

Every field has the paper's default (the paper's simulations), so ``Config()``
— or an empty TOML file — is the paper's default run. A TOML file has one
table per section::

    [data]
    L = 40
    parents = [1, 2]

    [schedule]
    kind = "staged"
    durations = [1e3, 1e9, 1e5]

Unknown sections or keys, values of the wrong type (every key has one
declared type, :data:`KEY_TYPES`: a bool is not an integer, a float is never
truncated, NaN and infinities are refused) and values out of range raise
``ValueError`` naming the key (``data.L``), the value given and what was
expected, before anything is computed. Every integer key has bounds
(:data:`LIMITS`, with the number of parents, of selectable sets and the depth of a
kernel literal), checked before any size is computed from it; the memory the
configuration needs is checked by :func:`gflow.runs.preflight` before any compute.
"""
from ._limits import LIMITS as LIMITS
from ._limits import MAX_KERNEL_DEPTH as MAX_KERNEL_DEPTH
from ._limits import MAX_PARENTS as MAX_PARENTS
from ._limits import MAX_SETS as MAX_SETS
from ._limits import init_bounds as init_bounds
from ._limits import n_sets as n_sets
from ._load import N_WARN as N_WARN
from ._load import load_config as load_config
from ._load import refuse_sgd as refuse_sgd
from ._load import warnings_for as warnings_for
from ._sections import KEY_TYPES as KEY_TYPES
from ._sections import METHODS as METHODS
from ._sections import SECTIONS as SECTIONS
from ._sections import STOCHASTIC_METHODS as STOCHASTIC_METHODS
from ._sections import Config as Config
from ._sections import KeyType as KeyType
from ._sections import ScheduleConfig as ScheduleConfig
from ._sections import SDESection as SDESection
from ._sections import SGDSection as SGDSection
from ._sections import SolverConfig as SolverConfig
from ._sections import check_sgd_sampling as check_sgd_sampling
from ._sections import did_you_mean as did_you_mean
from ._sections import from_dict as from_dict

# the names this module had before it became a package (tests and notebooks read them)
_KEY_TYPES = KEY_TYPES
_SECTIONS = SECTIONS
