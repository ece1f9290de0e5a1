"""deepnmt-prepare-data (deepnmt_data.prepare; python scripts/prepare_data.py) on tiny archives in the
real IWSLT/WMT formats, offline (--from-dir).

What is predicted independently of the script: the fixture sentences are "Moses-stable"
(punctuation already separated), so the tokenized text is the fixture text (lowercased for
IWSLT), and the split/cleaning rules of docs/data-preparation.md are applied to the fixture's
own list of lines.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures_data import IWSLT14_SETS, IWSLT17_SETS, make_iwslt, make_wmt, truncate

from deepnmt_data import corpora
from deepnmt_data.prepare import workers
from deepnmt_data.prepare.archives import download
from deepnmt_data.prepare.cli import main
from deepnmt_data.prepare.common import STEPS, DataPrepError, Log
from deepnmt_data.prepare.text import clean_reason, decoded_lines, parse_segs, parse_tags

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "prepare_data.py"


def lines(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


def unbpe(path: Path):
    return [ln.replace("@@ ", "") for ln in lines(path)]


def run_main(*argv):
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def iwslt14(tmp_path_factory):
    d = tmp_path_factory.mktemp("iwslt14-in")
    return d, make_iwslt(d)


@pytest.fixture(scope="module")
def wmt(tmp_path_factory):
    d = tmp_path_factory.mktemp("wmt-in")
    return d, make_wmt(d, ("de", "fr", "cs"))


def msc_split(content, every=23, max_len=175):
    """MSC reading: every 23rd line is valid (not cleaned), the rest is cleaned."""
    valid = [c for i, c in enumerate(content, 1) if i % every == 0]
    train = [c for i, c in enumerate(content, 1) if i % every and c[2] in ("ok", "title", "desc")]
    return train, valid


def fairseq_split(content, every=23):
    """fairseq's prepare-iwslt14.sh: clean first, then every 23rd cleaned line is valid."""
    clean = [c for c in content if c[2] in ("ok", "title", "desc")]
    return ([c for i, c in enumerate(clean, 1) if i % every],
            [c for i, c in enumerate(clean, 1) if i % every == 0])


def load_bin(bin_dir: Path, src: str, tgt: str):
    from fairseq.data import Dictionary, data_utils
    d = Dictionary.load(str(bin_dir / f"dict.{src}.txt"))
    assert Dictionary.load(str(bin_dir / f"dict.{tgt}.txt")).symbols == d.symbols     # joined dictionary
    out = {}
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            ds = data_utils.load_indexed_dataset(str(bin_dir / f"{split}.{src}-{tgt}.{lang}"), d)
            assert ds is not None, f"{split}.{lang} missing"
            out[split, lang] = [d.string(ds[i]) for i in range(len(ds))]
    return out


# ============================================================================ IWSLT14, as a user
@pytest.mark.slow
def test_iwslt14_end_to_end_subprocess_idempotent_and_refuses_overwrite(tmp_path, iwslt14):
    indir, info = iwslt14
    root = tmp_path / "data"
    cmd = [sys.executable, str(SCRIPT), "iwslt14-de-en", "--data-root", str(root), "--from-dir", str(indir),
           "--bpe-merges", "50", "--workers", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ds = root / "iwslt14-de-en"
    assert (ds / ".done").is_file()
    assert "tok: train" in first.stdout and "bin: done" in first.stdout          # progress is shown

    train, valid = msc_split(info["content"])
    assert len(valid) == len(info["content"]) // 23 and len(train) == len(info["content"]) - len(valid) - 2
    # header lines removed, <title>/<description> text kept, lowercased, split as documented
    assert lines(ds / "tok" / "train.de") == [a.lower() for a, b, _ in train]
    assert lines(ds / "tok" / "train.en") == [b.lower() for a, b, _ in train]
    assert lines(ds / "tok" / "valid.de") == [a.lower() for a, b, _ in valid]
    assert lines(ds / "tok" / "valid.en") == [b.lower() for a, b, _ in valid]
    text = (ds / "tok" / "train.de").read_text(encoding="utf-8")
    assert "http" not in text and "<" not in text and "talkid" not in text and "science" not in text
    assert "anna muster 0 : ein vortrag" in text and any(c.isupper() for c in info["content"][0][0])
    # test = dev2010 + dev2012 (TEDX) + tst2010 + tst2011 + tst2012, XML <seg> text, U+2019 -> '
    for side, lang in enumerate(("de", "en")):
        want = [s.replace("\u2019", "'").lower() for st in IWSLT14_SETS for s in info["test"][st][lang]]
        assert lines(ds / "tok" / f"test.{lang}") == want
    assert "\u2019" not in (ds / "tok" / "test.de").read_text(encoding="utf-8")
    assert lines(ds / "raw" / "test.en") == [s for st in IWSLT14_SETS for s in info["test"][st]["en"]]
    # joint BPE applied to every split; the binarized data are exactly the BPE'd text
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert unbpe(ds / "bpe" / f"{split}.{lang}") == lines(ds / "tok" / f"{split}.{lang}")
    assert "@@" in (ds / "bpe" / "train.de").read_text(encoding="utf-8")
    codes = lines(ds / "bpe" / "code")
    assert codes[0].startswith("#version") and 0 < len(codes) - 1 <= 50
    data = load_bin(ds / "bin", "de", "en")
    for split, n in (("train", len(train)), ("valid", len(valid)), ("test", 15)):
        for lang in ("de", "en"):
            assert len(data[split, lang]) == n
    assert data["train", "de"][:5] == lines(ds / "bpe" / "train.de")[:5]
    stats = json.loads((ds / "STATS.json").read_text())
    assert stats["sizes"] == {"train": len(train), "valid": len(valid), "test": 15}
    assert stats["comparison_with_paper"]["valid"]["expected"] == 7584
    src = json.loads((ds / "SOURCES.json").read_text())["iwslt14-de-en"]
    assert src["sha256"] == hashlib.sha256(info["archive"].read_bytes()).hexdigest()
    assert src["origin"] == "from-dir"

    # a second run does nothing, quickly
    stamp = {p.name: p.stat().st_mtime_ns for p in (ds / "bin").iterdir()}
    t0 = time.time()
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "already prepared" in again.stdout
    assert time.time() - t0 < 10
    assert {p.name: p.stat().st_mtime_ns for p in (ds / "bin").iterdir()} == stamp

    # other settings: refused, nothing touched
    other = subprocess.run(cmd[:-4] + ["--bpe-merges", "60"], capture_output=True, text=True)
    assert other.returncode == 2 and "other settings" in other.stderr and "--force" in other.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (ds / "bin").iterdir()} == stamp
    assert json.loads((ds / "CONFIG.json").read_text())["bpe_merges"] == 50

    # --force rebuilds; stopped early, the directory does not look complete
    forced = subprocess.run(cmd[:-4] + ["--bpe-merges", "60", "--force", "--stop-after", "raw"],
                            capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr
    assert not (ds / ".done").exists() and not (ds / "bin").exists() and (ds / "raw" / "STEP.json").exists()
    assert json.loads((ds / "CONFIG.json").read_text())["bpe_merges"] == 60


def test_iwslt14_fairseq_variant_cleans_before_splitting(tmp_path, iwslt14):
    indir, info = iwslt14
    assert run_main("iwslt14-de-en-fairseq", "--data-root", tmp_path, "--from-dir", indir, "--workers", "1",
                    "--stop-after", "tok") == 0
    ds = tmp_path / "iwslt14-de-en-fairseq"
    train, valid = fairseq_split(info["content"])
    assert lines(ds / "tok" / "valid.en") == [b.lower() for a, b, _ in valid]
    assert lines(ds / "tok" / "train.en") == [b.lower() for a, b, _ in train]
    assert valid != msc_split(info["content"])[1]      # the fixture tells the two readings apart
    assert not (ds / ".done").exists()
    stats = json.loads((ds / "tok" / "STEP.json").read_text())["stats"]
    assert stats["train_dropped"] == {"ratio": 1, "length": 1}


def test_iwslt17_en_fr_drops_2017_tags_and_concatenates_seven_sets(tmp_path):
    indir = tmp_path / "in"
    info = make_iwslt(indir, year=17, src="en", tgt="fr")
    # the fixture cannot match the archive's known MD5
    assert run_main("iwslt17-en-fr", "--data-root", tmp_path / "d", "--from-dir", indir, "--workers", "1",
                    "--stop-after", "tok", "--ignore-checksums") == 0
    ds = tmp_path / "d" / "iwslt17-en-fr"
    train, valid = msc_split(info["content"])
    assert lines(ds / "tok" / "train.fr") == [b.lower() for a, b, _ in train]
    assert lines(ds / "tok" / "valid.en") == [a.lower() for a, b, _ in valid]
    text = (ds / "tok" / "train.en").read_text(encoding="utf-8")
    assert "rita" not in text and "tom trans" not in text and "docid" not in text and "<" not in text
    want = [s.replace("\u2019", "'").lower() for st in IWSLT17_SETS for s in info["test"][st]["fr"]]
    assert lines(ds / "tok" / "test.fr") == want and len(IWSLT17_SETS) == 7


# ============================================================================ WMT
def test_wmt14_en_de_end_to_end(tmp_path, wmt, monkeypatch):
    indir, info = wmt
    monkeypatch.setattr(workers, "CHUNK", 7)      # many jobs over 2 worker processes: order must be kept
    rc = run_main("wmt14-en-de", "--data-root", tmp_path, "--from-dir", indir, "--bpe-merges", "50",
                  "--workers", "2", "--ignore-checksums")
    assert rc == 0
    ds = tmp_path / "wmt14-en-de"
    tok_en, tok_de = lines(ds / "tok" / "train.en"), lines(ds / "tok" / "train.de")
    assert len(tok_en) == len(info["train"]["de"]) == 60        # Europarl + Common Crawl + NC v9, in order
    plain = [(i, en) for i, (en, de) in enumerate(info["train"]["de"]) if en.startswith("Item")]
    assert [tok_en[i] for i, _ in plain] == [en for _, en in plain]
    assert "a state @-@ of @-@ the @-@ art house from europarl ." in tok_en     # aggressive dash splits
    assert 'er sagte " ja " .' in tok_de                                          # normalize-punctuation
    assert "the red house ." in tok_en and "\u200b" not in "".join(tok_en)       # remove-non-printing-char
    assert "a line with a carriage return ." in tok_en                           # '\r' is not a line break
    # valid = newstest2013 (sgm), test = newstest2014 src.en / ref.de (not the decoys)
    assert lines(ds / "tok" / "valid.de") == info["valid"][2013]["de"]
    assert lines(ds / "tok" / "test.en")[2] == "nt14 src en 2 : it 's here ."
    assert lines(ds / "tok" / "test.en")[0] == "nt14 src en 0 : a well @-@ known fact ."
    assert all(ln.startswith("nt14 ref de") for ln in lines(ds / "tok" / "test.de"))
    assert lines(ds / "raw" / "test.de") == info["test"]["de"]["de"]          # untokenized reference
    assert "\u201e" in (ds / "tok" / "test.de").read_text(encoding="utf-8")   # test sets are not normalized
    # cleaning after BPE: the ratio outlier and the 260-token pair are gone, the rest kept
    bpe_en, bpe_de = lines(ds / "bpe" / "train.en"), lines(ds / "bpe" / "train.de")
    assert len(bpe_en) == len(bpe_de) == 60 - 2
    assert "Yes ." not in unbpe(ds / "bpe" / "train.en")
    assert max(len(x.split()) for x in bpe_en + bpe_de) <= 250
    for a, b in zip(bpe_en, bpe_de):
        assert clean_reason(a, b, 1, 250, 1.5) is None
    data = load_bin(ds / "bin", "en", "de")
    assert [len(data[s, "de"]) for s in ("train", "valid", "test")] == [58, 6, 5]
    assert data["train", "en"] == lines(ds / "bpe" / "train.en")      # every train token is in the dictionary
    stats = json.loads((ds / "STATS.json").read_text())
    assert stats["steps"]["bpe"]["train_dropped"] == {"ratio": 1, "length": 1}
    sources = json.loads((ds / "SOURCES.json").read_text())
    assert sources["wmt13-test"]["verified"].startswith("md5 MISMATCH ignored")


@pytest.mark.parametrize("name,checks", [
    ("wmt14-en-de-dd", {"valid.en": [f"nt12 en sentence {i} is here ." for i in range(4)]
                        + [f"nt13 en sentence {i} is here ." for i in range(6)]}),
    ("wmt14-en-de-gpkd", {"valid.de": [f"nt16 ref de {i} ." for i in range(3)]}),
    ("wmt14-en-fr", {"valid.fr": [f"nt12 fr sentence {i} is here ." for i in range(4)]
                     + [f"nt13 fr sentence {i} is here ." for i in range(6)]}),
    ("wmt15-cs-en", {"test.cs": [f"nt15 src cs {i} ." for i in range(4)],
                     "valid.cs": [f"nt13 cs sentence {i} is here ." for i in range(6)]}),
])
def test_wmt_recipes_read_the_right_members(tmp_path, wmt, name, checks):
    indir, info = wmt
    assert run_main(name, "--data-root", tmp_path, "--from-dir", indir, "--workers", "1", "--ignore-checksums",
                    "--stop-after", "tok") == 0
    ds = tmp_path / name
    for f, want in checks.items():
        assert lines(ds / "tok" / f) == want
    if name == "wmt14-en-fr":      # UN and giga-fren (gzip'ed members of an uncompressed .tar) included
        tr = lines(ds / "tok" / "train.fr")
        assert "un 3 fr ." in tr and tr[-1] == "giga 4 fr ." and len(tr) == 3 * 20 + 4 + 5
    if name == "wmt15-cs-en":
        assert lines(ds / "tok" / "train.en")[-1] == "Item 19 : the red house from nc ."   # NC v10


# ============================================================================ sentencepiece
def test_spm_alternative_and_resume_after_stop(tmp_path, iwslt14, capsys):
    indir, info = iwslt14
    base = ("iwslt14-en-de", "--data-root", tmp_path, "--from-dir", indir, "--workers", "1", "--spm",
            "--bpe-merges", "100")
    assert run_main(*base, "--stop-after", "tok") == 0
    capsys.readouterr()
    assert run_main(*base) == 0
    out = capsys.readouterr().out
    assert "raw: already done, skipped" in out and "tok: already done, skipped" in out
    ds = tmp_path / "iwslt14-en-de"
    assert (ds / "bpe" / "spm.model").is_file() and not (ds / "bpe" / "code").exists()
    assert 0 < len(lines(ds / "bpe" / "spm.vocab")) <= 100
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            seg = lines(ds / "bpe" / f"{split}.{lang}")
            assert ["".join(x.split()).replace("\u2581", " ").strip() for x in seg] == \
                lines(ds / "tok" / f"{split}.{lang}")
    assert "\u2581" in (ds / "bpe" / "train.en").read_text(encoding="utf-8")
    train, valid = msc_split(info["content"])
    data = load_bin(ds / "bin", "en", "de")         # direction en -> de
    assert [len(data[s, "en"]) for s in ("train", "valid", "test")] == [len(train), len(valid), 15]
    assert json.loads((ds / "CONFIG.json").read_text())["segmenter"] == "sentencepiece-unigram"
    # idempotent and protective (in-process twin of the subprocess test, which is marked slow)
    stamp = {p.name: p.stat().st_mtime_ns for p in (ds / "bin").iterdir()}
    capsys.readouterr()
    t0 = time.time()
    assert run_main(*base) == 0 and "already prepared" in capsys.readouterr().out and time.time() - t0 < 2
    assert run_main(*base[:-1], "120") == 2 and "other settings" in capsys.readouterr().err
    assert run_main(*[x for x in base if x != "--spm"]) == 2        # plain BPE is another setting too
    assert "segmenter: 'sentencepiece-unigram' -> 'subword-nmt'" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (ds / "bin").iterdir()} == stamp


# ============================================================================ bad inputs
@pytest.mark.parametrize("variant,message", [
    ({"drop_line": "en"}, r"train\.tags\.de-en\.de has 64 lines after removing metadata but "
                          r".*train\.tags\.de-en\.en has 63"),
    ({"empty": "de"}, r"train\.tags\.de-en\.de is empty"),
    ({"bad_utf8": "de"}, r"train\.tags\.de-en\.de: invalid UTF-8 at line 4"),
    ({"truncate": True}, r"truncated or corrupt"),
    ({"omit": "IWSLT14.TED.tst2012.de-en.en.xml"}, r"lacks the expected member\(s\) IWSLT14\.TED\.tst2012\.de-en\.en\.xml"),
])
def test_bad_archives_give_clear_errors_and_no_complete_looking_output(tmp_path, capsys, variant, message):
    import re
    indir = tmp_path / "in"
    kw = {k: v for k, v in variant.items() if k != "truncate"}
    info = make_iwslt(indir, **kw)
    if "truncate" in variant:
        truncate(info["archive"])
    rc = run_main("iwslt14-de-en", "--data-root", tmp_path / "d", "--from-dir", indir, "--workers", "1")
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err), err
    ds = tmp_path / "d" / "iwslt14-de-en"
    assert not (ds / ".done").exists() and not any((ds / s).exists() for s in STEPS)
    if variant == {"bad_utf8": "de"}:   # the documented way out keeps the alignment
        assert run_main("iwslt14-de-en", "--data-root", tmp_path / "d2", "--from-dir", indir, "--workers", "1",
                        "--allow-invalid-utf8", "--stop-after", "raw") == 0
        raw = lines(tmp_path / "d2" / "iwslt14-de-en" / "raw" / "train.iwslt14.de")
        assert len(raw) == len(info["content"]) and "\ufffd" in raw[0]


def test_missing_archive_checksum_mismatch_and_lock(tmp_path, wmt, capsys):
    indir, _ = wmt
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_main("wmt14-en-de", "--data-root", tmp_path / "a", "--from-dir", empty) == 2
    err = capsys.readouterr().err
    assert "not found in --from-dir" in err and all(f in err for f in (
        "training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "training-parallel-nc-v9.tgz",
        "wmt13-test.tgz", "wmt14-test-full.tgz (or test-full.tgz)"))
    # nothing was built, so other settings are not "other settings of existing data"
    assert run_main("wmt14-en-de", "--data-root", tmp_path / "a", "--from-dir", empty, "--bpe-merges", "77") == 2
    assert "not found in --from-dir" in capsys.readouterr().err

    before = (indir / "wmt13-test.tgz").read_bytes()
    assert run_main("wmt14-en-de", "--data-root", tmp_path / "b", "--from-dir", indir) == 2
    err = capsys.readouterr().err
    assert "expected 48eca5d02f637af44e85186847141f67" in err and "left as it is" in err
    assert (indir / "wmt13-test.tgz").read_bytes() == before
    assert not (tmp_path / "b" / "wmt14-en-de" / "raw").exists()

    ds = tmp_path / "c" / "wmt14-en-de"
    ds.mkdir(parents=True)
    with open(ds / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run_main("wmt14-en-de", "--data-root", tmp_path / "c", "--from-dir", indir) == 2
    assert "another prepare_data.py run" in capsys.readouterr().err


def test_dry_run_touches_nothing_and_list(tmp_path, iwslt14, capsys):
    indir, _ = iwslt14
    root = tmp_path / "root"
    assert run_main("wmt14-en-fr", "--data-root", root, "--from-dir", indir, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "training-giga-fren.tar: MISSING in --from-dir" in out and "40000 merges" in out
    assert "bin  [to do] fairseq-preprocess --source-lang en --target-lang fr --joined-dictionary" in out
    assert run_main("iwslt14-de-en", "--data-root", root, "--from-dir", indir, "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"use {indir / 'de-en.tgz'} (from-dir)" in out and "every 23rd training line (before cleaning)" in out
    assert not root.exists()
    assert run_main("--list") == 0
    listed = capsys.readouterr().out
    for name in ("iwslt14-de-en", "iwslt14-en-de", "iwslt14-de-en-fairseq", "iwslt17-en-fr", "wmt14-en-de",
                 "wmt14-en-de-dd", "wmt14-en-fr", "wmt15-cs-en"):
        assert name in listed


# ============================================================================ units
def test_parsers_and_clean_rule():
    st = {}
    tags = [b"<url>http://x</url>\n", b"<talkid>1</talkid>\n", b"<title>A  Title</title>\n",
            b"<speaker>S</speaker>\n", b"Hello\tworld \xc2\xa0 !\n", b'<reviewer href="x">R</reviewer>\n',
            b"<3 is a heart\n"]
    assert list(parse_tags(decoded_lines(tags, "t", st, False), "t", st)) == \
        ["A Title", "Hello world !", "<3 is a heart"]
    assert st["metadata_lines_dropped"] == 4
    ids = []
    sg = [b'<seg id="1">a \xe2\x80\x99 b</seg><seg id="2"> c </seg>\n', b"<p>\n", b'<seg id="3">d</seg>\n']
    assert list(parse_segs(decoded_lines(sg, "s", st, False), "s", st, ids)) == ["a \u2019 b", "c", "d"]
    assert ids == ["1", "2", "3"]
    with pytest.raises(DataPrepError, match="without its </seg>"):
        list(parse_segs(decoded_lines([b'<seg id="1">open\n'], "s", st, False), "s", st, []))
    assert clean_reason("a b", "c d e", 1, 250, 1.5) is None
    workers._init_worker({"tok": True, "langs": ("en", "de"), "lowercase": False, "aggressive": False})
    assert workers._tok_line("it\u2019s", "en", train=False) == "it 's"     # dev/test: U+2019 -> ' (fairseq)
    assert "\u2019" in workers._tok_line("it\u2019s", "en", train=True)
    assert clean_reason("a", "b c", 1, 250, 1.5) == "ratio"
    assert clean_reason("", "b", 1, 250, 1.5) == "empty"
    assert clean_reason(" ".join("a" * 251), " ".join("b" * 251), 1, 250, 1.5) == "length"
    assert clean_reason("x" * 1001, "y", 1, 250, 1.5) == "long_word"
    corpora.check_registry()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""

    def do_GET(self):
        if self.path != "/file.tgz":
            self.send_error(404)
            return
        data, start = self.payload, 0
        rng = self.headers.get("Range")
        type(self).requests.append(rng)  # before the body: the client may check as soon as it has read it
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *a):
        pass


def test_download_falls_back_resumes_and_says_what_to_do_offline(tmp_path):
    _RangeHandler.payload = bytes(range(256)) * 2000
    _RangeHandler.requests = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        arch = corpora.Archive("t", "t.tgz", (f"{base}/gone.tgz", f"{base}/file.tgz"), "a test archive")
        dest = tmp_path / "dl" / "t.tgz"
        dest.parent.mkdir()
        (dest.parent / "t.tgz.part").write_bytes(_RangeHandler.payload[:100_000])   # an interrupted download
        assert download(arch, dest, Log("t")) == f"{base}/file.tgz"
        assert dest.read_bytes() == _RangeHandler.payload and not (dest.parent / "t.tgz.part").exists()
        assert _RangeHandler.requests == ["bytes=100000-"]
    finally:
        srv.shutdown()
    offline = corpora.Archive("o", "o.tgz", ("http://127.0.0.1:1/o.tgz",), "an unreachable archive")
    with pytest.raises(DataPrepError, match="--from-dir DIR"):
        download(offline, tmp_path / "dl" / "o.tgz", Log("o"), timeout=5)
    assert not (tmp_path / "dl" / "o.tgz").exists()


# ============================================================================ the package
def test_data_package_imports_without_torch_or_fairseq():
    """Every module of deepnmt_data imports without torch, fairseq or deepnmt_fairseq (only the bin
    step imports fairseq, when it runs): the workers fork a light process, and the package
    works where the training stack is not installed."""
    code = ("import importlib, pkgutil, sys, deepnmt_data\n"
            "names = [m.name for m in pkgutil.walk_packages(deepnmt_data.__path__, 'deepnmt_data.')\n"
            "         if not m.name.endswith('__main__')]\n"
            "for n in names: importlib.import_module(n)\n"
            "assert 'deepnmt_data.prepare.cli' in names and 'deepnmt_data.evidence_corpus' in names, names\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fairseq', 'deepnmt_fairseq'))\n"
            "assert not bad, bad[:10]\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]


def test_wrapper_and_console_script_default_data_roots(tmp_path):
    """python scripts/prepare_data.py writes under <repo>/work/data, deepnmt-prepare-data under
    ./work/data (as deepnmt-repro reads it); $DEEPNMT_DATA wins over both."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "DEEPNMT_DATA"}
    exe = Path(sys.executable).with_name("deepnmt-prepare-data")
    for cmd, root in (([sys.executable, str(SCRIPT)], REPO / "work" / "data"),
                      ([str(exe)], tmp_path / "work" / "data"),
                      ([sys.executable, "-m", "deepnmt_data"], tmp_path / "work" / "data")):
        res = subprocess.run([*cmd, "iwslt14-de-en", "--dry-run"], capture_output=True, text=True, cwd=tmp_path,
                             env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"output: {root / 'iwslt14-de-en'}\n" in res.stdout, res.stdout
    res = subprocess.run([str(exe), "iwslt14-de-en", "--dry-run"], capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "DEEPNMT_DATA": str(tmp_path / "d")}, timeout=120)
    assert f"output: {tmp_path / 'd' / 'iwslt14-de-en'}\n" in res.stdout, res.stdout
    assert not (tmp_path / "work").exists() and not (tmp_path / "d").exists()
