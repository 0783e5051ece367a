"""`scripts/tex_packages.sh`, what `scripts/setup.sh --dev` installs for the report tests: it
judges TeX by the files the report needs, not by the binaries' names. Run on a PATH of stubs
(a `kpsewhich` that finds only the files it is given)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BINARIES = ("pdflatex", "lualatex", "pdftoppm", "pdftotext")
ALL_FILES = (
    "geometry.sty graphicx.sty cmr10.pfb booktabs.sty pdflscape.sty luaotfload.sty "
    "lmroman10-regular.otf"
).split()


def missing(tmp_path: Path, binaries: tuple[str, ...], files: list[str]) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in binaries:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    found = " ".join(files)
    (bin_dir / "kpsewhich").write_text(
        f'#!/bin/sh\nfor f in {found}; do [ "$f" = "$1" ] && echo /texmf/$1; done\nexit 0\n'
    )
    (bin_dir / "kpsewhich").chmod(0o755)
    out = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "tex_packages.sh")],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.parametrize(
    ("absent", "package"),
    [
        ("luaotfload.sty", "texlive-luatex"),  # texlive-latex-base's lualatex alone
        ("lmroman10-regular.otf", "fonts-lmodern"),
        ("booktabs.sty", "texlive-latex-recommended"),
    ],
)
def test_a_lualatex_without_what_the_report_needs_is_completed(
    tmp_path: Path, absent: str, package: str
) -> None:
    files = [f for f in ALL_FILES if f != absent]
    assert missing(tmp_path, BINARIES, files) == [package]


def test_nothing_is_installed_when_everything_is_there(tmp_path: Path) -> None:
    assert missing(tmp_path, BINARIES, ALL_FILES) == []


def test_a_bare_machine_gets_every_package(tmp_path: Path) -> None:
    assert missing(tmp_path, (), []) == [
        "texlive-latex-base",
        "texlive-latex-recommended",
        "texlive-luatex",
        "fonts-lmodern",
        "poppler-utils",
    ]
