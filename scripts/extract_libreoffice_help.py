#!/usr/bin/env python3
"""Build a sentence-aligned parallel corpus from the LibreOffice help (Debian packages).

    python scripts/extract_libreoffice_help.py --src en --tgt de --out data/libreoffice-help/en-de --download

A thin wrapper of ``deepnmt-extract-libreoffice-help`` (:mod:`deepnmt_data.libreoffice_help`,
where the pipeline is described); docs/data.md.
"""

import sys

from deepnmt_data.libreoffice_help import main

if __name__ == "__main__":
    sys.exit(main())
