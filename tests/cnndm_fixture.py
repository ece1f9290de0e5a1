"""A tiny CNN/DailyMail look-alike: story archives and URL lists in the layout of the real ones."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

_WORDS = ("the mayor city council police report said on monday new plan school children park river "
          "bridge money tax vote election court judge fire storm weather team game season player").split()


def _sentence(rng, n=None):
    return " ".join(rng.choice(_WORDS) for _ in range(n or rng.randint(5, 12))).capitalize()


def _story(rng):
    paras = [_sentence(rng) + rng.choice([".", "", "!"]) for _ in range(rng.randint(4, 8))]
    # highlights restate the first sentences (lead bias, as in the news data)
    highlights = [p.rstrip(".!") for p in paras[: rng.randint(2, 3)]]
    return "\n\n".join(paras) + "\n\n" + "".join(f"@highlight\n\n{h}\n\n" for h in highlights)


def make_cnndm_archives(dest: Path, sizes=(("train", 60), ("valid", 8), ("test", 8)), seed=1,
                        empty_article_in_train=True) -> Path:
    """cnn_stories.tgz, dailymail_stories.tgz and all_{train,val,test}.txt under ``dest``."""
    rng = random.Random(seed)
    dest.mkdir(parents=True, exist_ok=True)
    members = {"cnn": [], "dailymail": []}
    for split, n in sizes:
        urls = []
        for i in range(n):
            src = "cnn" if i % 3 == 0 else "dailymail"
            url = f"http://www.{src}.example/{split}/{i}.html"
            urls.append(url)
            text = _story(rng)
            if empty_article_in_train and split == "train" and i == 1:
                text = "@highlight\n\nA summary without an article\n"  # See et al. drop this one
            name = hashlib.sha1(url.encode()).hexdigest() + ".story"
            members[src].append((f"{src}/stories/{name}", text))
        fname = {"valid": "val"}.get(split, split)
        (dest / f"all_{fname}.txt").write_text("\n".join(urls) + "\n")
    for src, items in members.items():
        rng.shuffle(items)  # archive order is not the URL-list order
        with tarfile.open(dest / f"{src}_stories.tgz", "w:gz") as tar:
            for name, text in items:
                data = text.encode("utf-8")
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return dest
