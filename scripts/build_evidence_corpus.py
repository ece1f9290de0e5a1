#!/usr/bin/env python3
"""Build the evidence-study (GPU preset) en-de corpus from Debian packages (LibreOffice + GIMP help).

    python scripts/build_evidence_corpus.py --download
    python scripts/build_evidence_corpus.py --debs DIR     # the five .deb files in DIR

A thin wrapper of ``deepnmt-build-evidence-corpus`` (:mod:`deepnmt_data.evidence_corpus`,
where the corpus is described); docs/data.md.
"""

import sys

from deepnmt_data.evidence_corpus import main

if __name__ == "__main__":
    sys.exit(main())
