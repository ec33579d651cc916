"""A trajectory against a theory: the check report's rows, one module per group
(``_rows_stage1``, ``_rows_stage23``, ``_rows_ladder``, ``_rows_laws``), their
shared context (``_base``), the report and its two verdicts (``_report``) and
:func:`check` (``_checks``).

Layer rule: imports the layers below (``_util``, ``core``, ``dynamics``, ``theory``,
``gflow.config``, ``gflow.trajectory``); writes no files.
"""

from ._checks import check as check
from ._report import Report as Report
from ._report import Row as Row
from ._rows_edge import check_beside as check_beside
