"""fairseq-free helpers of the analysis tools (``deepnmt-plot``, ``deepnmt-difficulty``,
``deepnmt-attention``): log reading, difficulty splits, BLEU per part, results files
and matplotlib figures.  See docs/analysis.md."""
