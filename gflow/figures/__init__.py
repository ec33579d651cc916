"""Figures, the only importer of matplotlib: a run's figures (``_plot``, with
its panels in ``_panels`` and shared helpers in ``_base``) and a phase diagram's
(``_phase``).

Layer rule: imports the layers below; writes only the figure files it is asked for.
"""

from ._base import FORMATS as FORMATS
from ._eval import plot_eval as plot_eval
from ._limit import plot_limit as plot_limit
from ._phase import phase_row as phase_row
from ._phase import plot_phase as plot_phase
from ._plot import draw_run as draw_run
from ._seeds import plot_seeds as plot_seeds
from ._sharpness import plot_sharpness as plot_sharpness
