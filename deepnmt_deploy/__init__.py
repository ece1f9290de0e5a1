"""deepnmt_deploy: serving a model exported by ``deepnmt-export-ct2`` (CTranslate2), without
torch or fairseq.

    deepnmt-translate --model OUT_DIR < raw.txt > translations.txt
    deepnmt-serve --model OUT_DIR          # HTTP API with dynamic batching (serve.py)

The export itself (``deepnmt_fairseq.deploy.export``) builds the fairseq model and needs torch
and fairseq; translating needs only CTranslate2 (the ``deploy`` extra), sacremoses and
subword-nmt or sentencepiece, so a deployment machine can run it without the training stack,
and the command starts in about half a second instead of the ~5 s that importing torch and
fairseq costs.  Nothing in this package imports torch, fairseq or ``deepnmt_fairseq``
(``tests/test_deploy.py::test_translate_runs_without_torch_or_fairseq``).

It ships in two distributions built from this one directory: the training one
(``deepnmt-fairseq``, the repository's pyproject.toml) and the serving one (``deepnmt-deploy``,
``deploy-dist/pyproject.toml``), whose only dependencies are CTranslate2 and the tokenizers
(``tests/test_deploy.py::test_serving_distribution_installs_and_translates_without_torch``
installs its wheel into a fresh environment without torch).
"""

__version__ = "0.1.0"

INSTALL_HINT = ("CTranslate2 is not installed: pip install ctranslate2==4.8.5 (the serving distribution "
                "deepnmt-deploy depends on it; for the training one: pip install 'deepnmt-fairseq[deploy]')")

#: the file written next to the CTranslate2 model: tokenization, languages, limits, provenance
METADATA = "deepnmt_export.json"

#: the weight types deepnmt-export-ct2 can store (CTranslate2's compute types)
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float32", "float16")


def require_ctranslate2():
    """Import CTranslate2 or fail with the install command."""
    try:
        import ctranslate2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(f"error: {INSTALL_HINT} ({e})") from None
    return ctranslate2
