"""deepnmt_fairseq: very deep NMT for fairseq (load with ``--user-dir``).

Importing the package applies the plugin's listed fixes to fairseq (``fairseq_fixes.py``:
weights-only checkpoint loading on every fairseq version; on fairseq 0.12.3 also the
reliability guards -- atomic checkpoint copies, no silently dropped last batch, clear errors
for empty data and mismatched checkpoints, CPU/c10d DDP -- unless ``DEEPNMT_FAIRSEQ_FIXES=0``)
and registers every model, architecture, criterion and task of the plugin.
``python -m deepnmt_fairseq`` prints the directory to pass to ``--user-dir``;
``python -m deepnmt_fairseq --fixes`` lists the fixes and whether each is on.
"""

import os as _os

__version__ = "0.1.0"
USER_DIR = _os.path.dirname(_os.path.abspath(__file__))

from . import fairseq_fixes as _fairseq_fixes  # noqa: E402

_fairseq_fixes.install()


def _check_single_copy():
    """Refuse a second copy of the plugin (a clear error instead of fairseq's
    'Cannot register duplicate model')."""
    from fairseq.models import MODEL_REGISTRY

    existing = MODEL_REGISTRY.get("deepnmt_transformer")
    if existing is not None and not existing.__module__.startswith(__name__ + "."):
        import sys

        other = getattr(sys.modules.get(existing.__module__.split(".")[0]), "__file__", existing.__module__)
        raise ImportError(
            f"another copy of deepnmt_fairseq is already registered in fairseq (from {other}); "
            f"this copy is {USER_DIR}. Load the plugin once: either pass --user-dir or import "
            f"the installed package, not two different copies."
        )


_check_single_copy()

from . import models  # noqa: E402,F401
from . import criterions  # noqa: E402,F401
from . import tasks  # noqa: E402,F401
from . import optim  # noqa: E402,F401
