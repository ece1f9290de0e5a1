"""Tests for deepnmt_data.evidence_corpus (scripts/build_evidence_corpus.py; GPU-preset evidence corpus).

The five Debian packages are replaced by tiny synthetic .deb files built here
(ar archive + control.tar.xz + data.tar.xz in the real layout), so the tests
run offline in a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deb_fixtures import assert_same_files, read_pairs, write_deb

from deepnmt_data import evidence_corpus as bec

N_PAGES = 10
FRACTION = "0.15"  # 30 pairs per source -> 2 whole pages each for valid and test


# --------------------------------------------------------------------------
# Fixture .deb files
# --------------------------------------------------------------------------

def make_deb(directory: Path, package: str, version: str, files: dict[str, str]) -> None:
    write_deb(directory / f"{package}_{version.replace(':', '%3a')}_all.deb",
              f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
              "Description: test\n",
              {k: v.encode("utf-8") for k, v in files.items()})


LONG_EN = " ".join(["The long paragraph explains every option of the dialog in detail"] * 4) + "."
LONG_DE = " ".join(["Der lange Absatz erklärt jede Option des Dialogs ausführlich im Detail"] * 4) + "."


def lo_page(lang: str, i: int) -> str:
    en = lang == "en-US"
    paras = [
        ("hd_id1", f"LibreOffice page {i}", f"LibreOffice-Seite {i}"),
        ("par_id2", f"Opens dialog number {i}.", f"Öffnet Dialog Nummer {i}."),
        # the same pair on every page: must end up in train only
        ("par_id3", "Click OK.", "Klicken Sie auf OK."),
    ]
    if i == 0:  # over the bundled corpus's 30-word cap
        paras.append(("par_id4", LONG_EN, LONG_DE))
    body = "".join(f'<p id="{pid}" class="paragraph">{e if en else d}</p>\n'
                   for pid, e, d in paras)
    return f"<html><head><title>x</title></head><body>{body}</body></html>\n"


NAV = ('<div class="navheader"><table><tr><th>{t}</th></tr><tr><td><a href="a.html">{prev}</a>'
       '</td></tr></table></div>')


def gimp_page(lang: str, i: int, extra_para: bool = False) -> str:
    en = lang == "en"
    t = (lambda e, d: e if en else d)
    body = NAV.format(t=t(f"GIMP page {i}", f"GIMP-Seite {i}"), prev=t("Prev", "Zurück"))
    body += (f'<div class="sect2"><div class="titlepage"><h3 class="title">'
             f'<a id="x{i}"></a>{t(f"Filter number {i}", f"Filter Nummer {i}")}</h3></div>'
             '<a class="indexterm" id="idm1">IndexTerm</a>'
             + "<p>\n  " + t(f"The filter {i} blurs the image. It works on layers.",
                             f"Der Filter {i} macht das Bild unscharf. Er wirkt auf Ebenen.")
             + "\n</p>"
             + '<div class="itemizedlist"><ul>'
             f'<li><p>{t(f"Radius of filter {i}", f"Radius von Filter {i}")}</p></li>'
             + "<li><p>" + t('Click <span class="guibutton">OK</span>.',
                             'Klicken Sie auf <span class="guibutton">OK</span>.') + "</p></li>"
             + '</ul></div>'
             '<pre class="programlisting">(define (script-fu-test) 1)</pre>'
             f'<table><tr><td>{t(f"Amount {i}", f"Menge {i}")}</td><td>GIMP</td></tr></table>')
    if extra_para:
        body += "<p>Ein zusätzlicher Absatz nur in der Übersetzung.</p>"
    body += ('<div class="navfooter"><a class="reportbug" href="x">'
             + t("Report a bug in GIMP", "Einen Fehler melden") + "</a></div></div>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">'
            f'<head><title>{i}</title></head><body>{body}</body></html>\n')


MISMATCH_PAGE = 7  # its German page has one more <p>: dropped and counted
COPYRIGHT = ("Files: *\nCopyright: The GIMP Documentation Team\nLicense: GFDL-NIV-1.2+\n"
             " Permission is granted to copy ...\n")


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("debs")
    lo_ver, gimp_ver = "4:7.4.7-1+deb12u14", "2.10.34-2"
    for lang, pkg in (("en-US", "libreoffice-help-en-us"), ("de", "libreoffice-help-de")):
        make_deb(d, pkg, lo_ver, {f"usr/share/libreoffice/help/{lang}/text/shared/p{i}.html":
                                  lo_page(lang, i) for i in range(N_PAGES)})
    for lang in ("en", "de"):
        files = {f"usr/share/gimp/2.0/help/{lang}/page-{i}.html":
                 gimp_page(lang, i, extra_para=(lang == "de" and i == MISMATCH_PAGE))
                 for i in range(N_PAGES)}
        files[f"usr/share/gimp/2.0/help/{lang}/gimp-help-plain.css"] = "p {}\n"
        make_deb(d, f"gimp-help-{lang}", gimp_ver, files)
    make_deb(d, "gimp-help-common", gimp_ver,
             {"usr/share/doc/gimp-help-common/copyright": COPYRIGHT})
    return d


def build(debs: Path, out: Path, *extra: str) -> int:
    return bec.main(["--debs", str(debs), "--out", str(out), "--heldout-fraction", FRACTION,
                     *extra])


@pytest.fixture(scope="module")
def built(debs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "en-de"
    assert build(debs, out) == 0
    return out


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------

def test_parse_gimp_page_structure_and_skips():
    struct, blocks = bec.parse_gimp_page(gimp_page("en", 3))
    texts = [b.text for b in blocks if b.text]
    assert texts == ["Filter number 3", "The filter 3 blurs the image. It works on layers.",
                     "Radius of filter 3", "Click OK.", "Amount 3", "GIMP"]
    assert struct[:3] == ["div", "div", "h3"] and "li" in struct and "td" in struct
    # navigation, index terms, code and report-a-bug links are not part of it
    assert "navheader" not in struct and not any("Prev" in t or "define" in t or "IndexTerm" in t
                                                 or "Report" in t for t in texts)
    # the same page in German has the same structure
    assert bec.parse_gimp_page(gimp_page("de", 3))[0] == struct
    assert bec.parse_gimp_page(gimp_page("de", 3, extra_para=True))[0] != struct


def test_gimp_pairing_by_structure_and_mismatch_dropped(built):
    st = json.loads((built / "STATS.json").read_text())
    g = st["extraction"]["gimp"]
    assert g["files_common"] == N_PAGES
    assert g["files_structure_match"] == N_PAGES - 1
    assert g["files_structure_mismatch"] == 1
    assert g["files_structure_mismatch_list"] == [f"page-{MISMATCH_PAGE}.html"]
    # per matching page: 5 translated blocks + "GIMP" (untranslated, dropped)
    assert g["dropped_untranslated"] == N_PAGES - 1
    assert g["pairs_after_filters"] == 5 * (N_PAGES - 1)
    everything = [p for s in ("train", "valid", "test") for p in read_pairs(built, s)]
    assert ("Filter number 3", "Filter Nummer 3") in everything
    # whole block, not split into sentences
    assert ("The filter 3 blurs the image. It works on layers.",
            "Der Filter 3 macht das Bild unscharf. Er wirkt auf Ebenen.") in everything
    assert not any(f"filter {MISMATCH_PAGE}" in e.lower() or "zusätzlicher" in d for e, d in everything)
    assert not any("Prev" in e or "define" in e for e, _ in everything)


def test_libreoffice_part_has_no_length_cap(built):
    everything = [p for s in ("train", "valid", "test") for p in read_pairs(built, s)]
    assert ("LibreOffice page 2", "LibreOffice-Seite 2") in everything
    assert len(LONG_EN.split()) > 30 and (LONG_EN, LONG_DE) in everything


def test_whole_document_splits_and_no_overlap(built):
    st = json.loads((built / "STATS.json").read_text())
    split_of: dict[str, str] = {}
    for source in ("libreoffice", "gimp"):
        held = st["heldout_files"][source]
        assert held["valid"] and held["test"] and not set(held["valid"]) & set(held["test"])
    page_no = {}
    for f in (st["heldout_files"]["libreoffice"]["valid"]):
        page_no[("lo", int(f.split("/p")[-1].split(".")[0]))] = "valid"
    for f in (st["heldout_files"]["libreoffice"]["test"]):
        page_no[("lo", int(f.split("/p")[-1].split(".")[0]))] = "test"
    for name in ("valid", "test"):
        for f in st["heldout_files"]["gimp"][name]:
            page_no[("gimp", int(f.split("-")[1].split(".")[0]))] = name
    data = {s: read_pairs(built, s) for s in ("train", "valid", "test")}
    for split, ps in data.items():
        for en, _ in ps:
            if en.startswith(("LibreOffice page", "Opens dialog number")):
                key = ("lo", int(en.rstrip(".").split()[-1]))
            elif en.startswith(("Filter number", "Radius of filter", "Amount")):
                key = ("gimp", int(en.split()[-1]))
            elif en.startswith("The filter"):
                key = ("gimp", int(en.split()[2]))
            else:
                continue
            split_of.setdefault(key, split)
            assert split_of[key] == split, f"page {key} spread over splits"
            assert page_no.get(key, "train") == split
    # every page of both sources is somewhere, in exactly one split
    assert len(split_of) == 2 * N_PAGES - 1
    train_en = {e for e, _ in data["train"]}
    valid_en = {e for e, _ in data["valid"]}
    assert not valid_en & train_en
    assert not {e for e, _ in data["test"]} & (train_en | valid_en)
    # the sentence shared by all pages lives in train only, once
    assert [e for e, _ in data["train"]].count("Click OK.") == 1
    assert st["splits"]["valid_dropped_src_in_train"] > 0
    pp = st["pairs_per_source"]
    for name in ("train", "valid", "test"):
        assert pp["libreoffice"][name] > 0 and pp["gimp"][name] > 0
        assert pp["libreoffice"][name] + pp["gimp"][name] == len(data[name]) == st["pairs"][name]


def test_stats_and_notice(built):
    st = json.loads((built / "STATS.json").read_text())
    pkgs = {p["package"]: p for p in st["packages"]}
    assert set(pkgs) == set(bec.ALL_PACKAGES)
    assert all(len(p["sha256"]) == 64 for p in pkgs.values())
    assert pkgs["gimp-help-de"]["version"] == "2.10.34-2"
    assert set(st["files"]) == {f"{s}.{l}.gz" for s in ("train", "valid", "test")
                                for l in ("en", "de")}
    notice = (built / "NOTICE").read_text()
    assert "MPL-2.0" in notice and "GFDL-NIV-1.2+" in notice
    assert "The GIMP Documentation Team" in notice  # quoted from the copyright file


def test_reproducible_byte_identical(debs, built, tmp_path):
    out = tmp_path / "again"
    assert build(debs, out) == 0
    assert_same_files(built, out)


def test_refuses_to_overwrite_unless_force(debs, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep").write_text("x")
    assert build(debs, out) == 1
    assert "--force" in capsys.readouterr().err
    assert (out / "keep").exists() and not (out / "train.en.gz").exists()
    assert build(debs, out, "--force") == 0
    assert not (out / "keep").exists() and (out / "train.en.gz").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]  # no temp dirs left


def test_missing_package_is_a_clear_error(debs, tmp_path, capsys):
    d = tmp_path / "debs"
    d.mkdir()
    for p in debs.iterdir():
        if not p.name.startswith("gimp-help-de_"):
            (d / p.name).write_bytes(p.read_bytes())
    assert build(d, tmp_path / "out") == 1
    assert "gimp-help-de" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
