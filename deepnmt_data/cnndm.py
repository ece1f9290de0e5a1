"""CNN/DailyMail, non-anonymized, as See et al. (2017) make it (MSC Appendix A) - standard library only.

MSC Appendix A: "We use the non-anonymized version of the CNN/DailyMail (CNNDM) dataset
(See et al., 2017) ... preprocessed ... using the scripts from the authors of See et al.
(2017) [github.com/abisee/cnn-dailymail], and the resulting dataset contains 287,226 documents
with summaries for training, 13,368 for validation and 11,490 for test ... The input document
is truncated to the first 640 tokens."

What See et al.'s ``make_datafiles.py`` does, and what we do (``deepnmt-prepare-data cnndm``):

* **splits**: ``url_lists/all_{train,val,test}.txt``; a story's file is
  ``<sha1 hex of the URL>.story`` in ``cnn_stories.tgz`` / ``dailymail_stories.tgz``
  (:func:`url_hash`).  Output follows the URL lists' order.
* **story**: paragraphs before the first ``@highlight`` are the article, each line after an
  ``@highlight`` is one summary sentence (:func:`parse_story`).
* **tokenization**: See et al. run Stanford CoreNLP's PTB tokenizer; CoreNLP (Java) is not
  available here, so lines are tokenized with the Moses tokenizer (sacremoses, English), our
  substitute.  Then lowercased and :func:`fix_missing_period` (See et al.'s order).
* **article** = the article lines joined with spaces; **summary** = the summary sentences joined
  with :data:`SENT_SEP` (See et al. wrap each in ``<s> ... </s>``; one separator token keeps the
  sentence boundaries that summary-level ROUGE-L needs, and costs the decoder one token each).
* **empty articles** are dropped (See et al.'s pointer-generator data loader skips them: one
  training story, hence 287,226 of the 287,227 training URLs).
* **truncation** (MSC): the article to its first :data:`MAX_DOC_TOKENS` = 640 *subword* tokens,
  after BPE (:func:`truncate`): the tokens the model reads, which fit its 768 positions
  ("maximum length to 768").  The paper does not say which tokens it counts; summaries are not
  truncated.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, List, Tuple

#: MSC Appendix A: "The input document is truncated to the first 640 tokens."
MAX_DOC_TOKENS = 640
#: summary sentence separator in the target text (one token; removed / split on for ROUGE)
SENT_SEP = "<q>"
#: See et al. make_datafiles.py: lines ending in one of these get no extra period
END_TOKENS = (".", "!", "?", "...", "'", "`", '"', "\u2019", "\u201d", ")")
#: See et al.'s split sizes (url_lists) and the MSC paper's (after dropping the empty article)
URL_LIST_SIZES = {"train": 287227, "valid": 13368, "test": 11490}
PAPER_SIZES = {"train": 287226, "valid": 13368, "test": 11490}


def url_hash(url: str) -> str:
    """See et al.'s ``hashhex``: the story file of a URL is ``<sha1 hex>.story``."""
    return hashlib.sha1(url.strip().encode("utf-8")).hexdigest()


def read_url_list(lines: Iterable[str]) -> List[str]:
    """The story hashes of a URL list, in its order (blank lines ignored)."""
    return [url_hash(u) for u in lines if u.strip()]


def fix_missing_period(line: str) -> str:
    """See et al.: add " ." to a line that does not end in punctuation (not to ``@highlight``)."""
    if "@highlight" in line or line == "" or line.endswith(END_TOKENS):
        return line
    return line + " ."


def parse_story(text: str) -> Tuple[List[str], List[str]]:
    """(article lines, summary sentences) of a ``.story`` file, untokenized, blank lines dropped."""
    article, highlights, next_is_highlight = [], [], False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("@highlight"):
            next_is_highlight = True
        elif next_is_highlight:
            highlights.append(line)
        else:
            article.append(line)
    return article, highlights


def make_pair(article: List[str], highlights: List[str], tokenize) -> Tuple[str, str]:
    """See et al.'s article / abstract from tokenized, lowercased, period-fixed lines."""
    def prep(line):
        return fix_missing_period(" ".join(tokenize(line).split()).lower())

    art = " ".join(p for p in (prep(x) for x in article) if p)
    summ = f" {SENT_SEP} ".join(p for p in (prep(x) for x in highlights) if p)
    return art, summ


def truncate(tokens: str, n: int = MAX_DOC_TOKENS) -> str:
    """The first ``n`` whitespace tokens."""
    parts = tokens.split()
    return " ".join(parts[:n])


def summary_sentences(summary: str) -> List[str]:
    """The sentences of a (BPE-removed) summary, split at :data:`SENT_SEP`."""
    return [s.strip() for s in summary.split(SENT_SEP) if s.strip()]
