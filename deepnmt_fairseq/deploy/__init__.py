"""Deployment through CTranslate2 (issue 17): export and raw-text translation.

    deepnmt-export-ct2 CHECKPOINT OUT_DIR [--quantization int8|int8_float32|float32|float16]
    deepnmt-translate --model OUT_DIR < raw.txt > translations.txt

CTranslate2 is an optional extra (``pip install .[deploy]``): nothing outside this package
imports it, and inside it only :mod:`.export` (building the model) and :mod:`.translate`
(running it) do, lazily, with an error that says how to install it.  The exportability
check (:func:`.export.refusals`) and the text pipeline (:mod:`.text`) need only fairseq.
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
