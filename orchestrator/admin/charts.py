"""Charts drawn on the server as SVG, so the console loads no charting library and runs no
script to draw: a stacked bar per minute or day, completed below and failed above.

Each bar is a group carrying its numbers (`data-at`, `data-completed`, `data-failed`) and a
`<title>` that a pointer or a screen reader gets ("12:34 UTC: 3 completed, 1 failed"); the
chart has a title and a one-line summary of its own, and the page puts a table of the same
numbers beside it. Colours come from classes in `console.css` (the admin's theme variables for
text and lines), never from inline styles, which the site's CSP refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from orchestrator.admin.activity import Bar

WIDTH = 720
HEIGHT = 180
# Room for the y axis's labels on the left and the x axis's below.
LEFT = 36
BOTTOM = 20
TOP = 8


def stacked_bars(
    bars: Sequence[Bar],
    *,
    chart_id: str,
    title: str,
    key: Callable[[datetime], str],
    name: Callable[[datetime], str],
    tick_every: int,
) -> SafeString:
    """`bars` as an SVG chart: `key` gives each bar's `data-at`, `name` its label (in its
    title, and under every `tick_every`-th bar)."""
    completed = sum(bar.completed for bar in bars)
    failed = sum(bar.failed for bar in bars)
    top = _scale_top(max((bar.completed + bar.failed for bar in bars), default=0))
    plot_h = HEIGHT - TOP - BOTTOM
    step = (WIDTH - LEFT) / max(len(bars), 1)
    width = max(step * 0.8, 1.0)

    def height(n: int) -> float:
        return n / top * plot_h

    groups = []
    for index, bar in enumerate(bars):
        x = LEFT + index * step + (step - width) / 2
        done_h, failed_h = height(bar.completed), height(bar.failed)
        base = TOP + plot_h
        groups.append(
            (
                key(bar.at),
                bar.completed,
                bar.failed,
                name(bar.at),
                bar.completed,
                bar.failed,
                *_rect("completed", x, base - done_h, width, done_h),
                *_rect("failed", x, base - done_h - failed_h, width, failed_h),
            )
        )
    bars_svg = format_html_join(
        "",
        '<g class="bar" data-at="{}" data-completed="{}" data-failed="{}">'
        "<title>{}: {} completed, {} failed</title>"
        '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>'
        '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/></g>',
        groups,
    )
    ticks = format_html_join(
        "",
        '<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (_n(LEFT + index * step + step / 2), HEIGHT - 5, name(bar.at))
            for index, bar in enumerate(bars)
            if index % tick_every == 0
        ),
    )
    return format_html(
        '<svg id="{id}" class="chart" viewBox="0 0 {w} {h}" role="img" '
        'aria-labelledby="{id}-title {id}-desc" preserveAspectRatio="xMinYMin meet">'
        '<title id="{id}-title">{title}</title>'
        '<desc id="{id}-desc">{completed} completed, {failed} failed</desc>'
        '<line class="axis" x1="{left}" y1="{base}" x2="{w}" y2="{base}"/>'
        '<line class="grid" x1="{left}" y1="{top_y}" x2="{w}" y2="{top_y}"/>'
        '<text class="tick" x="{label_x}" y="{top_label_y}" text-anchor="end">{top}</text>'
        '<text class="tick" x="{label_x}" y="{base}" text-anchor="end">0</text>'
        "{bars}{ticks}</svg>",
        id=chart_id,
        w=WIDTH,
        h=HEIGHT,
        title=title,
        completed=completed,
        failed=failed,
        left=LEFT,
        base=TOP + plot_h,
        top_y=TOP,
        label_x=LEFT - 4,
        top_label_y=TOP + 4,
        top=top,
        bars=bars_svg,
        ticks=ticks,
    )


def _rect(cls: str, x: float, y: float, width: float, height: float) -> tuple[str, ...]:
    return cls, _n(x), _n(y), _n(width), _n(height)


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _scale_top(most: int) -> int:
    """The y axis's top: the smallest 1, 2 or 5 times a power of ten at or above `most`."""
    scale = 1
    while True:
        for factor in (1, 2, 5):
            if most <= factor * scale:
                return factor * scale
        scale *= 10
