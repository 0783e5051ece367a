"""Overlapping text boxes, for the checks that a rendered page or figure prints no text over
other text (tests/test_report_render.py, tests/test_report_html.py)."""

from __future__ import annotations


def overlaps(
    boxes: list[tuple[float, float, float, float, str]], core: float
) -> list[tuple[str, str]]:
    """Pairs of boxes whose cores overlap: each box shrunk by `core` of its height at top and
    bottom (text boxes of a font span its whole ascent and descent, so the boxes of adjacent
    lines touch; the glyphs' middles never do unless the text overlaps)."""

    def shrink(b: tuple[float, float, float, float, str]) -> tuple[float, float, float, float]:
        pad = core * (b[3] - b[1])
        return b[0] + 0.2, b[1] + pad, b[2] - 0.2, b[3] - pad

    cores = sorted((shrink(b), b[4]) for b in boxes)
    found = []
    for i, (a, ta) in enumerate(cores):  # sweep over x
        for b, tb in cores[i + 1 :]:
            if b[0] >= a[2]:
                break
            if min(a[3], b[3]) > max(a[1], b[1]):
                found.append((ta, tb))
    return found
