"""Models of the plugin (auto-imported by fairseq's ``--user-dir``)."""

from . import deep_transformer  # noqa: F401  (registers the model)
from . import architectures  # noqa: F401  (registers the named architectures)
from . import rnmt  # noqa: F401  (registers rnmt_plus and its named architectures)
from . import hiertrans  # noqa: F401  (registers hiertrans and hiertrans_cnndm_36l)
