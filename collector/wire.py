"""The compiled helpers (``_wire``), loaded once for the stages that use them: decoding and the store.

Optional: without a C compiler at install time the pure-Python paths serve, and
``AGENTFUNNEL_PURE_PYTHON=1`` turns the compiled ones off.
"""

from __future__ import annotations

import os
from typing import Any

from .batches import SPAN_COLUMNS

_wire: Any
try:
    from . import _wire  # type: ignore[attr-defined,no-redef]  # the optional compiled module, declared above
except ImportError:  # not built
    _wire = None
else:
    if _wire.COLUMNS != SPAN_COLUMNS:  # a stale build against another column layout
        _wire = None
# Whether decode_traces_protobuf takes the compiled path.
USE_WIRE = _wire is not None and os.environ.get("AGENTFUNNEL_PURE_PYTHON") != "1"
# The compiled module (the store builds Arrow buffers with it), None when off.
WIRE: Any = _wire if USE_WIRE else None
