"""Self-contained HTML reports (tables + matplotlib figures inlined as PNG), shared by evaluation,
benchmarks and drift: one file to open or to attach to an MLflow run."""

from __future__ import annotations

import base64
import html
import io
import numbers
import re
from typing import Any

NUMERIC = re.compile(r"^(n/a|[-+]?[\d,]*\.?\d+ ?%?)$")


def figure_html(fig: Any, alt: str) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def new_figure(width: float = 7, height: float = 3.5, ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


def _text(value: Any) -> str:
    """A value as a reader reads it: numbers rounded, a mapping as `key: value` pairs, a list comma-separated."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, dict):
        return "; ".join(f"{k}: ({_text(v)})" if isinstance(v, dict) else f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    return str(value)


def table_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)

    def td(value: Any) -> str:  # numbers (and "n/a", "+4.5%") right-aligned, text left
        number = isinstance(value, numbers.Number) and not isinstance(value, bool)
        text = _text(value)
        cls = "" if number or value is None or NUMERIC.match(text) else ' class="t"'
        return f"<td{cls}>{html.escape(text)}</td>"

    body = "".join("<tr>" + "".join(td(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def page(title: str, sections: list[tuple[str, str]], subtitle: str = "") -> str:
    """`sections`: (heading, HTML body) pairs."""
    parts = "".join(f"<h2>{html.escape(h)}</h2>{body}" for h, body in sections)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}
table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f3f3f3}}
td:first-child,td.t{{text-align:left}}
img{{max-width:100%}}.wide{{overflow-x:auto}}code{{background:#f6f6f6}}</style></head><body><h1>{html.escape(title)}</h1>
<p>{html.escape(subtitle)}</p>{parts}</body></html>"""
