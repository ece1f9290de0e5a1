"""Reading ``fairseq-generate`` output (one place for every tool of the project).

fairseq prints ``S-id``/``T-id`` (source/target), ``H-id`` (best hypothesis,
with its score) and a final "Translated N sentences (M tokens) in Xs" line.
"""

import re
from typing import Dict

_TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
                         r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)")
_FAIRSEQ_BLEU = re.compile(r"Generate \S+ with beam=\d+: (BLEU4? = [\d.]+)")


def parse_generate(text: str) -> Dict[str, object]:
    """Hypotheses (H-), references (T-), sources (S-) by sentence id, and the speed line."""
    hyps: Dict[int, str] = {}
    refs: Dict[int, str] = {}
    srcs: Dict[int, str] = {}
    for line in text.splitlines():
        if line[:2] in ("H-", "T-", "S-"):
            tag, _, rest = line.partition("\t")
            try:
                sid = int(tag[2:])
            except ValueError:
                continue
            if line[0] == "H":
                if sid not in hyps:  # the best hypothesis
                    hyps[sid] = rest.split("\t", 1)[1] if "\t" in rest else ""
            elif line[0] == "T":
                refs[sid] = rest
            else:
                srcs[sid] = rest
    out: Dict[str, object] = {"hyps": hyps, "refs": refs, "srcs": srcs}
    m = None
    for m in _TRANSLATED.finditer(text):
        pass
    if m:
        out.update(sentences=int(m.group(1).replace(",", "")), gen_tokens=int(m.group(2).replace(",", "")),
                   decode_seconds=float(m.group(3)), sentences_per_s=float(m.group(4)),
                   tokens_per_s=float(m.group(5)))
    b = _FAIRSEQ_BLEU.search(text)
    if b:
        out["fairseq_bleu"] = b.group(1)
    return out
