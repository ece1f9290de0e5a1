"""Tests for deepnmt_data.libreoffice_help (scripts/extract_libreoffice_help.py) and the shipped corpus.

All fixture .deb files are generated here (ar archive + control.tar.xz +
data.tar.xz with a few help pages in the real layout), so the tests run
offline and fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from deb_fixtures import ROOT, ar_archive, assert_same_files, read_gz, read_pairs, write_deb

from deepnmt_data.debs import ExtractError, read_ar
from deepnmt_data import libreoffice_help as elh

SCRIPT = ROOT / "scripts" / "extract_libreoffice_help.py"
SHIPPED = ROOT / "data" / "libreoffice-help" / "en-de"


VERSION = "4:7.4.7-1+deb12u14"


# --------------------------------------------------------------------------
# Fixture .deb builder
# --------------------------------------------------------------------------

def make_deb(path: Path, package: str, files: dict[str, str]) -> Path:
    data = {name: text.encode("utf-8") for name, text in files.items()}
    data[f"usr/share/doc/{package}/copyright"] = b"License: MPL-2.0\n"
    return write_deb(path, f"Package: {package}\nSource: libreoffice\nVersion: {VERSION}\n"
                           "Architecture: all\nDescription: test\n", data)


def page(lang: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="{lang}" dir="ltr">\n<head>\n'
            f'<meta http-equiv="Content-Type" content="text/html; charset=utf-8">\n'
            f'<title>Help</title>\n<script type="text/javascript">var s = "<p id=\'par_id0\'>x</p>";'
            f'</script>\n</head>\n<body>\n<div id="DisplayArea">\n{body}\n</div>\n'
            f'<footer><div id="DEBUG" class="debug"><h3 class="bug">Help content debug info:</h3>'
            f'</div></footer>\n</body>\n</html>\n')


def p(pid: str, text: str, cls: str = "paragraph") -> str:
    return f'<p id="{pid}" class="{cls}" dir="auto">{text}</p>\n'


def switchinline(mac: str, default: str) -> str:
    return ('<span id="swlnsystextshared01xml_1" class="switchinline">'
            '<span hidden="true" id="MACtextshared01xml_1" class="MAC">'
            f'<span class="keycode">{mac}</span></span>'
            '<span hidden="true" id="defaulttextshared01xml_1">'
            f'<span class="keycode">{default}</span></span></span>')


# (id, english, german) for the main page; comments say what each one tests.
MAIN = [
    ("hd_id1", "New", "Neu"),
    # switchinline: only the default (Ctrl/Strg) variant may survive
    ("par_id10", "Press " + switchinline("Command", "Ctrl") + '<span class="keycode">+N</span>'
     " to create a new document.",
     "Drücken Sie " + switchinline("Befehl", "Strg") + '<span class="keycode">+N</span>'
     ", um ein neues Dokument zu erstellen."),
    # untranslated
    ("par_id11", "Syntax:", "Syntax:"),
    # extreme length ratio (2 vs 17 words)
    ("par_id12", "Click Next.", "Falls Sie nicht den Standardtreiber verwenden, wählen Sie den "
     "passenden Treiber aus und klicken Sie danach auf Weiter."),
    # splits equally into two sentences
    ("par_id13", "Opens a <span class=\"emph\">file</span>. The file is loaded into a new window.",
     "Öffnet eine <span class=\"emph\">Datei</span>. Die Datei wird in ein neues Fenster geladen."),
    # splits unequally (1 vs 2, 2 vs 1): kept as one pair
    ("par_id14", "Moves the object to the back, so that it is behind the other objects.",
     "Verschiebt das Objekt nach hinten. Es befindet sich dann hinter den anderen Objekten."),
    ("par_id23", "Select a range. Click Apply to sort it.",
     "Wählen Sie einen Bereich aus und klicken Sie auf Anwenden, um ihn zu sortieren."),
    # abbreviations must not split: 2 sentences on both sides
    ("par_id15", "Choose a format, e.g. PDF or 1. ODT. Then click Save...",
     "Wählen Sie ein Format, z. B. PDF oder 1. ODT. Klicken Sie dann auf Speichern..."),
    # image only: empty
    ("par_id16", '<img src="media/a.svg" alt="Icon New">', '<img src="media/a.svg" alt="Symbol Neu">'),
    # whitespace and entities are normalised
    ("par_id17", "Use\n   the  &quot;Tab&quot;\tkey&nbsp;here.",
     "Verwenden Sie\n die  &quot;Tab&quot;-Taste\thier."),
]


def main_page(lang: str) -> str:
    en = lang == "en-US"
    body = "".join(p(i, e if en else d) for i, e, d in MAIN)
    # code sample with a translated comment: dropped as code
    body += p("par_id18", "REM Show a message" if en else "REM Meldung anzeigen", cls="code")
    # block switch: the WIN-only paragraph is not the default variant
    body += ('<span id="swlnsystextsharedoptionenjavaxml_1" class="switch">'
             '<span hidden="true" id="WINtextsharedoptionenjavaxml_1" class="WIN">'
             + p("par_id19", "Install a 64-bit Java runtime for Windows." if en
                 else "Installieren Sie eine 64-Bit-Java-Laufzeitumgebung für Windows.")
             + '</span><span hidden="true" id="defaulttextsharedoptionenjavaxml_1"></span></span>')
    # a paragraph that exists in only one language
    body += p("par_id20", "Only in English." if en else "Nur auf Deutsch.").replace(
        "par_id20", "par_id20" if en else "par_id21")
    # a paragraph with a broken embed placeholder
    body += p("par_id22", "See <span class=\"bug\">[text/a.xhp#x not found].</span> for details."
              if en else "Siehe <span class=\"bug\">[text/a.xhp#x not found].</span> für Details.")
    return page(lang, body)


N_PAGES = 12
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
         "india", "juliet", "kilo", "lima"]


def guide_page(lang: str, i: int, reverse: bool) -> str:
    en = lang == "en-US"
    w = WORDS[i]
    items = [
        # exact duplicate pair on every page
        ("hd_id100", "Options", "Optionen"),
        # same English on every page, different German: train-overlap removal
        ("par_id101", "Click OK.", f"Klicken Sie auf OK ({w})."),
        # same id on every page, different text: alignment is per file
        ("par_id102", f"This page is about {w}.", f"Diese Seite handelt von {w}."),
        ("par_id103", f"The {w} settings are stored in the profile.",
         f"Die Einstellungen für {w} werden im Profil gespeichert."),
    ]
    if reverse:  # German pages list the paragraphs in another order
        items = items[::-1]
    return page(lang, "".join(p(pid, e if en else d) for pid, e, d in items))


def help_files(lang: str) -> dict[str, str]:
    base = f"usr/share/libreoffice/help/{lang}/text/"
    files = {base + "shared/01/new.html": main_page(lang)}
    for i in range(N_PAGES):
        files[base + f"shared/guide/page{i:02d}.html"] = guide_page(lang, i, lang == "de")
    return files


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("debs")
    make_deb(d / f"libreoffice-help-en-us_{VERSION.replace(':', '%3a')}_all.deb",
             "libreoffice-help-en-us", help_files("en-US"))
    make_deb(d / f"libreoffice-help-de_{VERSION.replace(':', '%3a')}_all.deb",
             "libreoffice-help-de", help_files("de"))
    return d


def run_main(debs: Path, out: Path, *extra: str) -> int:
    return elh.main(["--src", "en", "--tgt", "de", "--debs", str(debs), "--out", str(out),
                     "--heldout-fraction", "0.1", *extra])


@pytest.fixture(scope="module")
def built(debs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "en-de"
    assert run_main(debs, out) == 0
    return out


def all_pairs(out: Path) -> list[tuple[str, str]]:
    return [pr for s in ("train", "valid", "test") for pr in read_pairs(out, s)]


# --------------------------------------------------------------------------
# Unit tests
# --------------------------------------------------------------------------

def test_parse_switchinline_keeps_default_only():
    html = page("en-US", MAIN[1][0].join(['<p id="', '">']) + MAIN[1][1] + "</p>"
                + '<span class="switch"><span hidden="true" id="WIN1" class="WIN">'
                + p("par_id2", "Windows only.") + '</span><span hidden="true" id="default1">'
                + p("par_id3", "All systems.") + "</span></span>"
                + p("par_id4", "Text<script>var x = 1;</script> and<style>p {}</style> more."))
    segs = {s.key[0]: s.text for s in elh.parse_help_page(html)}
    assert segs["par_id10"] == "Press Ctrl+N to create a new document."
    assert "par_id2" not in segs  # non-default block case dropped
    assert segs["par_id3"] == "All systems."  # default block case kept
    assert "par_id0" not in segs  # text inside <script> is not markup
    assert segs["par_id4"] == "Text and more."


def test_parse_unclosed_p_does_not_swallow_next_paragraph():
    segs = elh.parse_help_page('<p id="par_id1">One<p id="par_id2">Two</p><h2 id="hd_id3">Three</h2>')
    assert [(s.key[0], s.text) for s in segs] == [
        ("par_id1", "One"), ("par_id2", "Two"), ("hd_id3", "Three")]


def test_repeated_id_in_one_file_gets_occurrence_index():
    segs = elh.parse_help_page('<p id="par_id1">A</p><p id="par_id1">B</p>')
    assert [s.key for s in segs] == [("par_id1", 0), ("par_id1", 1)]


@pytest.mark.parametrize("text,expected", [
    ("One. Two.", ["One.", "Two."]),
    ("Is it? Yes! Done.", ["Is it?", "Yes!", "Done."]),
    ("Use a format, e.g. PDF. Then save.", ["Use a format, e.g. PDF.", "Then save."]),
    ("Wählen Sie z. B. Datei. Dann OK.", ["Wählen Sie z. B. Datei.", "Dann OK."]),
    ("Das ist z.B. so. Und d.h. Text.", ["Das ist z.B. so.", "Und d.h. Text."]),
    ("Am 1. Januar startet es. Dann nicht.", ["Am 1. Januar startet es.", "Dann nicht."]),
    ("Choose File - Open... The dialog opens.", ["Choose File - Open... The dialog opens."]),
    ("Version 7.4 is new. It works.", ["Version 7.4 is new.", "It works."]),
    ("Ends here. lower case continues.", ["Ends here. lower case continues."]),
    ("Use cf. Chapter 2. Done.", ["Use cf. Chapter 2. Done."]),
    ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
])
def test_split_sentences(text, expected):
    assert elh.split_sentences(text) == expected


def test_length_ratio_threshold():
    assert elh.length_ratio_ok("a b", "a b c d e f g h")          # 8 <= 3*2+2
    assert not elh.length_ratio_ok("a b", "a b c d e f g h i")    # 9 > 8
    assert elh.length_ratio_ok("Options", "Weitere Optionen hier")  # short allowance


def test_read_ar_rejects_bad_input():
    good = ar_archive([("debian-binary", b"2.0\n"), ("x", b"abc")])
    assert read_ar(good) == {"debian-binary": b"2.0\n", "x": b"abc"}
    with pytest.raises(ExtractError, match="not an ar archive"):
        read_ar(b"PK\x03\x04 zip file")
    with pytest.raises(ExtractError, match="truncated"):
        read_ar(good[:-2])


# --------------------------------------------------------------------------
# End-to-end on the fixture packages
# --------------------------------------------------------------------------

def test_cli_subprocess_runs_and_writes_everything(debs, tmp_path):
    out = tmp_path / "data" / "en-de"
    r = subprocess.run([sys.executable, str(SCRIPT), "--src", "en", "--tgt", "de",
                        "--debs", str(debs), "--out", str(out), "--heldout-fraction", "0.1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "shipped: train" in r.stdout
    names = sorted(x.name for x in out.iterdir())
    assert names == ["NOTICE", "STATS.json"] + sorted(
        f"{s}.{l}.gz" for s in ("train", "valid", "test") for l in ("en", "de"))
    notice = (out / "NOTICE").read_text()
    assert "MPL-2.0" in notice and "https://help.libreoffice.org" in notice
    assert f"libreoffice-help-de {VERSION}" in notice
    assert not list(out.parent.glob(".*tmp*"))  # no temp dir left behind
    h = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "--max-train-words" in h.stdout


def test_alignment_by_file_and_id(built):
    pairs = set(all_pairs(built))
    # German pages list the paragraphs in reverse order; ids still match
    for i, w in enumerate(WORDS):
        assert (f"This page is about {w}.", f"Diese Seite handelt von {w}.") in pairs
        assert (f"The {w} settings are stored in the profile.",
                f"Die Einstellungen für {w} werden im Profil gespeichert.") in pairs
    # same id (par_id102) on different pages never crosses files
    assert not any(e.startswith("This page is about alpha") and "bravo" in d for e, d in pairs)
    # a paragraph present in one language only is not aligned
    assert not any("Only in English" in e or "Nur auf Deutsch" in d for e, d in pairs)
    stats = json.loads((built / "STATS.json").read_text())["extraction"]
    assert stats["segments_src_only"] == 1 and stats["segments_tgt_only"] == 1


def test_switchinline_default_variant_in_output(built):
    pairs = all_pairs(built)
    assert ("Press Ctrl+N to create a new document.",
            "Drücken Sie Strg+N, um ein neues Dokument zu erstellen.") in pairs
    text = " ".join(e + " " + d for e, d in pairs)
    assert "Command" not in text and "Befehl" not in text
    assert "64-bit Java" not in text  # non-default case of a block switch


def test_filters(built):
    pairs = all_pairs(built)
    en = [e for e, _ in pairs]
    stats = json.loads((built / "STATS.json").read_text())["extraction"]
    assert "Syntax:" not in en and stats["dropped_untranslated"] >= 1
    assert "Click Next." not in en and stats["dropped_length_ratio"] == 1
    assert stats["dropped_empty"] >= 1 and not any(not e or not d for e, d in pairs)
    assert not any("REM" in e for e in en) and stats["dropped_code"] == 1
    assert not any("not found" in e for e in en) and stats["dropped_broken_embed"] == 1
    # exact duplicates: "Options" is on every page, but appears once in train
    assert en.count("Options") == 1
    assert stats["pairs_unique"] < stats["pairs_after_filters"]
    # whitespace/entities normalised, no tabs
    assert ('Use the "Tab" key here.', 'Verwenden Sie die "Tab"-Taste hier.') in pairs
    assert not any("\t" in e + d or "  " in e + d for e, d in pairs)


def test_sentence_splitting_in_output(built):
    pairs = all_pairs(built)
    assert ("Opens a file.", "Öffnet eine Datei.") in pairs
    assert ("The file is loaded into a new window.",
            "Die Datei wird in ein neues Fenster geladen.") in pairs
    # 1 vs 2 sentences: stays whole
    assert ("Moves the object to the back, so that it is behind the other objects.",
            "Verschiebt das Objekt nach hinten. Es befindet sich dann hinter den anderen "
            "Objekten.") in pairs
    assert ("Select a range. Click Apply to sort it.",
            "Wählen Sie einen Bereich aus und klicken Sie auf Anwenden, um ihn zu sortieren.") in pairs
    assert ("Choose a format, e.g. PDF or 1. ODT.",
            "Wählen Sie ein Format, z. B. PDF oder 1. ODT.") in pairs


def test_whole_file_heldout_split_and_train_overlap(built):
    stats = json.loads((built / "STATS.json").read_text())
    held = stats["heldout_files"]
    assert held["valid"] and held["test"] and not set(held["valid"]) & set(held["test"])
    train, valid, test = (read_pairs(built, s) for s in ("train", "valid", "test"))
    train_de = {d for _, d in train}
    checked = 0
    for pairs, files in ((valid, held["valid"]), (test, held["test"])):
        for rel in files:
            if "/page" not in rel:
                continue
            w = WORDS[int(rel.split("/page")[1][:2])]
            # the whole file went to this held-out split, none of it to train
            assert (f"This page is about {w}.", f"Diese Seite handelt von {w}.") in pairs
            assert f"Diese Seite handelt von {w}." not in train_de
            # its "Click OK." pair is gone too: the English side occurs in train
            assert f"Klicken Sie auf OK ({w})." not in train_de | {d for _, d in pairs}
            checked += 1
    assert checked >= 2
    train_en = {e for e, _ in train}
    assert "Click OK." in train_en
    for pairs in (valid, test):
        assert pairs and not {e for e, _ in pairs} & train_en
    assert not {e for e, _ in valid} & {e for e, _ in test}
    sp = stats["splits"]
    assert sp["valid_dropped_src_in_train"] + sp["test_dropped_src_in_train"] >= 2


def test_train_sampling_and_max_words(debs, tmp_path):
    out = tmp_path / "s"
    assert run_main(debs, out, "--max-train-words", "6", "--train-size", "5") == 0
    train = read_pairs(out, "train")
    assert len(train) == 5
    assert all(len(e.split()) <= 6 and len(d.split()) <= 6 for e, d in train)
    stats = json.loads((out / "STATS.json").read_text())
    assert stats["shipped"]["train_pairs"] == 5
    assert stats["shipped"]["train_pairs_within_max_words"] > 5
    # a seeded random sample, in corpus order, not simply the first pairs
    full_out = tmp_path / "full"
    assert run_main(debs, full_out, "--max-train-words", "6", "--train-size", "0", "--full") == 0
    eligible = read_pairs(full_out, "train")
    assert len(eligible) == stats["shipped"]["train_pairs_within_max_words"]
    positions = [eligible.index(pr) for pr in train]
    assert positions == sorted(positions) and positions != list(range(5))


def test_make_splits_overlap_removal(monkeypatch):
    corpus = elh.Corpus(pairs=[
        ("a.html", "Shared.", "Geteilt A."), ("a.html", "Train only.", "Nur Training."),
        ("v.html", "Shared.", "Geteilt V."), ("v.html", "Held out.", "Zurückgehalten V."),
        ("v.html", "Valid only.", "Nur Validierung."), ("v.html", "Valid only.", "Nur Validierung."),
        ("t.html", "Held out.", "Zurückgehalten T."), ("t.html", "Test only.", "Nur Test."),
    ])
    monkeypatch.setattr(elh, "choose_heldout_files", lambda *a: (["v.html"], ["t.html"]))
    splits, info = elh.make_splits(corpus, seed=1)
    assert splits["train"] == [("Shared.", "Geteilt A."), ("Train only.", "Nur Training.")]
    assert splits["valid"] == [("Held out.", "Zurückgehalten V."),
                               ("Valid only.", "Nur Validierung.")]
    assert splits["test"] == [("Test only.", "Nur Test.")]
    assert info["valid_dropped_src_in_train"] == 1 and info["test_dropped_src_in_valid"] == 1


def test_choose_heldout_files_whole_files_and_size():
    pairs = [(f"f{i:02d}", f"s{i}-{j}", f"t{i}-{j}") for i in range(50) for j in range(i % 5 + 1)]
    pairs += [("huge", f"h{j}", f"g{j}") for j in range(100)]
    valid, test = elh.choose_heldout_files(pairs, seed=3, fraction=0.05)
    assert valid and test and not set(valid) & set(test) and "huge" not in valid + test
    target = round(0.05 * len(pairs))
    for files in (valid, test):
        n = sum(1 for rel, _, _ in pairs if rel in files)
        assert target <= n <= 1.5 * target
    assert elh.choose_heldout_files(pairs, seed=3, fraction=0.05) == (valid, test)
    assert elh.choose_heldout_files(pairs, seed=4, fraction=0.05) != (valid, test)


def test_deterministic_byte_identical(debs, built, tmp_path):
    out2 = tmp_path / "again"
    assert run_main(debs, out2) == 0
    for name in assert_same_files(built, out2):
        if name.endswith(".gz"):  # no timestamp or file name in the gzip header
            header = (built / name).read_bytes()[:10]
            assert header[4:8] == b"\0\0\0\0" and header[3] & 0x08 == 0
    # a different seed picks other held-out files
    out3 = tmp_path / "seed2"
    assert run_main(debs, out3, "--seed", "2") == 0
    h1 = json.loads((built / "STATS.json").read_text())["heldout_files"]
    h3 = json.loads((out3 / "STATS.json").read_text())["heldout_files"]
    assert h1 != h3


def test_refuses_to_overwrite_unless_force(debs, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert run_main(debs, out) == 1
    assert "exists" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "precious"
    assert run_main(debs, out, "--force") == 0
    assert not (out / "keep.txt").exists() and (out / "train.en.gz").exists()
    assert [x.name for x in tmp_path.iterdir()] == ["o"]  # no temp/backup dirs left


def test_failure_leaves_no_dataset(debs, tmp_path, monkeypatch):
    calls = []

    def boom(path, lines):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full")
        path.write_bytes(b"partial")

    monkeypatch.setattr(elh, "write_gz_lines", boom)
    with pytest.raises(OSError, match="disk full"):
        run_main(debs, tmp_path / "o")
    assert list(tmp_path.iterdir()) == []


def test_full_writes_complete_train(debs, tmp_path):
    out = tmp_path / "f"
    assert run_main(debs, out, "--full", "--train-size", "3") == 0
    full = list(zip(read_gz(out / "full" / "train.en.gz"), read_gz(out / "full" / "train.de.gz")))
    assert len(full) > 3 and len(read_pairs(out, "train")) == 3
    assert set(read_pairs(out, "train")) <= set(full)


def test_clear_errors_for_broken_debs(debs, tmp_path):
    en = next(debs.glob("libreoffice-help-en-us_*.deb"))
    de = next(debs.glob("libreoffice-help-de_*.deb"))

    def cli(d: Path):
        return subprocess.run([sys.executable, str(SCRIPT), "--src", "en", "--tgt", "de",
                               "--debs", str(d), "--out", str(tmp_path / "o")],
                              capture_output=True, text=True, timeout=60)

    # missing package
    only_en = tmp_path / "only_en"
    only_en.mkdir()
    (only_en / en.name).write_bytes(en.read_bytes())
    r = cli(only_en)
    assert r.returncode == 1 and "no libreoffice-help-de_*.deb" in r.stderr

    # truncated package
    trunc = tmp_path / "trunc"
    trunc.mkdir()
    (trunc / en.name).write_bytes(en.read_bytes())
    (trunc / de.name).write_bytes(de.read_bytes()[: len(de.read_bytes()) // 2])
    r = cli(trunc)
    assert r.returncode == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr

    # not an ar archive
    (trunc / de.name).write_bytes(b"<html>404 Not Found</html>")
    r = cli(trunc)
    assert r.returncode == 1 and "not an ar archive" in r.stderr

    # a .deb without the help tree
    make_deb(trunc / de.name, "libreoffice-help-de", {"usr/share/doc/x/README": "x"})
    r = cli(trunc)
    assert r.returncode == 1 and "no help files" in r.stderr
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------
# The shipped corpus
# --------------------------------------------------------------------------

def test_shipped_corpus():
    assert (SHIPPED.parent / "NOTICE").is_file()
    stats = json.loads((SHIPPED / "STATS.json").read_text())
    split_en = {}
    for split in ("train", "valid", "test"):
        en, de = read_gz(SHIPPED / f"{split}.en.gz"), read_gz(SHIPPED / f"{split}.de.gz")
        assert len(en) == len(de) == stats["shipped"][f"{split}_pairs"], split
        assert all(line.strip() == line and line and "\t" not in line for line in en + de)
        split_en[split] = set(en)
        if split == "train":
            assert len(en) >= 15000
            assert all(len(x.split()) <= 30 for x in en + de)
        else:
            assert len(en) >= 300
    assert not split_en["valid"] & split_en["train"]
    assert not split_en["test"] & split_en["train"]
    assert stats["packages"][1]["package"] == "libreoffice-help-de"
