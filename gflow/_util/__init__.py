"""Utilities with no gflow imports: the bottom layer.

Atomic file writes and JSON conversion (``_io``), least-squares fits (``_fit``),
means and standard errors (``_stats``), the scalar root finders (``_roots``), the
Threefry uniforms of the fresh sampler (``_rng``) and the verified cache of
exported programs (``_export_cache``). Nothing here knows the model.
"""

from ._export_cache import cached_call as cached_call
from ._export_cache import disable_export_cache as disable_export_cache
from ._export_cache import enable_export_cache as enable_export_cache
from ._export_cache import export_cache_folder as export_cache_folder
from ._export_cache import free_compiled_programs as free_compiled_programs
from ._export_cache import map_limit as map_limit
from ._export_cache import mapped_regions as mapped_regions
from ._export_cache import prepare_call as prepare_call
from ._export_cache import relieve_memory_maps as relieve_memory_maps
from ._export_cache import source_fingerprint as source_fingerprint
from ._fit import PLATEAU_EXIT as PLATEAU_EXIT
from ._fit import linear_fit as linear_fit
from ._fit import log_slope as log_slope
from ._fit import power_exponent as power_exponent
from ._io import STAGE_CODES as STAGE_CODES
from ._io import atomic_savefig as atomic_savefig
from ._io import atomic_write_bytes as atomic_write_bytes
from ._io import atomic_write_json as atomic_write_json
from ._io import atomic_write_npz as atomic_write_npz
from ._io import atomic_write_text as atomic_write_text
from ._io import jsonable as jsonable
from ._io import remove_temporaries as remove_temporaries
from ._io import rows_of_stage as rows_of_stage
from ._io import versions as versions
from ._io import write_csv as write_csv
from ._rng import normal as rng_normal  # noqa: F401 (re-export: the fresh sampler's Threefry normals)
from ._rng import uniform as rng_uniform  # noqa: F401 (re-export: its uniforms)
from ._roots import bisect_root as bisect_root
from ._roots import bracketed_root as bracketed_root
from ._roots import golden_max as golden_max
from ._scaling import L_TERMS as L_TERMS
from ._scaling import Z95 as Z95
from ._scaling import ScalingFit as ScalingFit
from ._scaling import chi2_sf as chi2_sf
from ._scaling import fit_scaling as fit_scaling
from ._scaling import t95 as t95
from ._stats import mean_se as mean_se
from ._text import format_cell as format_cell
from ._text import show_value as show_value
from ._text import table_cell as table_cell
