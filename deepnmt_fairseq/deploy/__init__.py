"""Deployment through CTranslate2 (issue 17): the export.

    deepnmt-export-ct2 CHECKPOINT OUT_DIR [--quantization int8|int8_float32|float32|float16]

:mod:`.export` writes the fairseq model into a CTranslate2 model directory; serving it
(``deepnmt-translate``, the text pipeline) lives in the top-level package ``deepnmt_deploy``,
which needs neither torch nor fairseq.  CTranslate2 is an optional extra (``pip install
.[deploy]``), imported lazily with an error that says how to install it; the exportability check
(:func:`.export.refusals`) needs only fairseq.
"""
