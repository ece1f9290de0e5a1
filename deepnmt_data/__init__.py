"""deepnmt_data: the data preparation of the papers' corpora, without torch or fairseq.

* :mod:`deepnmt_data.corpora`: the registry of the corpora (archives, members, recipes, the
  papers' sizes); :mod:`deepnmt_data.cnndm`: See et al.'s CNN/DailyMail rules.
* :mod:`deepnmt_data.prepare`: ``deepnmt-prepare-data`` (``python scripts/prepare_data.py``):
  download or ``--from-dir``, Moses tokenization, joint BPE or sentencepiece, then
  ``fairseq-preprocess`` (the one step that imports fairseq, when it runs).
* :mod:`deepnmt_data.debs`, :mod:`deepnmt_data.libreoffice_help`,
  :mod:`deepnmt_data.evidence_corpus`: parallel corpora built from the help pages of Debian
  packages (``deepnmt-extract-libreoffice-help``, ``deepnmt-build-evidence-corpus``).

Nothing here imports torch, fairseq or ``deepnmt_fairseq`` at import time
(``tests/test_prepare_data.py::test_data_package_imports_without_torch_or_fairseq``);
``deepnmt_fairseq`` reads the registry from here.  docs/data-preparation.md, docs/data.md.
"""
