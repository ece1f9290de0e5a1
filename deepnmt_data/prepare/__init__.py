"""``deepnmt-prepare-data``: the papers' corpora from archives to fairseq's binarized data.

One module per stage or corpus family: :mod:`.archives` (find, download, checksum, read),
:mod:`.text` (the raw formats, cleaning), :mod:`.workers` (tokenization and subword
segmentation in worker processes), :mod:`.subwords` (learning BPE / sentencepiece),
:mod:`.binarize` (fairseq-preprocess), :mod:`.job` (the driver), :mod:`.translation`
(IWSLT, WMT), :mod:`.summarization` (CNN/DailyMail), :mod:`.cli`.
"""
