#!/usr/bin/env bash
# The Debian packages the report tests' TeX and PDF tools still lack, on one line (empty: none).
# It checks what the report uses, not the binaries: texlive-latex-base alone gives a `lualatex`
# without LuaTeX's font loader (luaotfload) or the Latin Modern OpenType fonts, and the report
# then fails with "Font shape TU/lmr/m/n undefined" (docs/footguns.md).
has() { command -v "$1" >/dev/null 2>&1; }
found() { has kpsewhich && [ -n "$(kpsewhich "$1" 2>/dev/null)" ]; }
need=()
{ has pdflatex && has lualatex && found geometry.sty && found graphicx.sty && found cmr10.pfb; } \
  || need+=(texlive-latex-base)
{ found booktabs.sty && found pdflscape.sty; } || need+=(texlive-latex-recommended)
found luaotfload.sty || need+=(texlive-luatex)           # lualatex's font loader
found lmroman10-regular.otf || need+=(fonts-lmodern)     # lualatex's default font (TU/lmr)
{ has pdftoppm && has pdftotext; } || need+=(poppler-utils)
echo "${need[*]}"
