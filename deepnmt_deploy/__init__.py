"""deepnmt_deploy: serving a model exported by ``deepnmt-export-ct2`` (CTranslate2), without
torch or fairseq.

    deepnmt-translate --model OUT_DIR < raw.txt > translations.txt

The export itself (``deepnmt_fairseq.deploy.export``) builds the fairseq model and needs torch
and fairseq; translating needs only CTranslate2 (the ``deploy`` extra), sacremoses and
subword-nmt or sentencepiece, so a deployment machine can run it without the training stack,
and the command starts in about half a second instead of the ~5 s that importing torch and
fairseq costs.  Nothing in this package imports torch, fairseq or ``deepnmt_fairseq``
(``tests/test_deploy.py::test_translate_runs_without_torch_or_fairseq``).
"""

INSTALL_HINT = "CTranslate2 is not installed: pip install 'deepnmt-fairseq[deploy]' (or pip install ctranslate2==4.8.5)"

#: the file written next to the CTranslate2 model: tokenization, languages, limits, provenance
METADATA = "deepnmt_export.json"


def require_ctranslate2():
    """Import CTranslate2 or fail with the install command."""
    try:
        import ctranslate2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(f"error: {INSTALL_HINT} ({e})") from None
    return ctranslate2
