"""``report.html``: the report as one self-contained page (images as data URIs, inline CSS and JS).

Nothing is fetched when it is viewed: no CDN, no font, no script from elsewhere. The 3-D view of the
camera poses and the sparse points is a plain ``<canvas>`` drawn by a few lines of JS; drag to rotate.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.fileio import UntrustedFileError, read_bounded, safe_path
from raykit.pipeline.config import StageConfigs
from raykit.pipeline.report import FIGURES, sections

__all__ = ["scene_points", "write_html"]

MAX_POINTS = 4000

_CSS = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
canvas{border:1px solid #bbb;cursor:grab;background:#fafafa}code{background:#eee;padding:0 3px}"""

_JS = """(function(){
const d=JSON.parse(document.getElementById('scene-data').textContent);
const c=document.getElementById('scene');const g=c.getContext('2d');
let yaw=0.6,pitch=0.4,drag=null;
function rot(p){const cy=Math.cos(yaw),sy=Math.sin(yaw),cp=Math.cos(pitch),sp=Math.sin(pitch);
 const x=cy*p[0]+sy*p[1],y=-sy*p[0]+cy*p[1];return [x,cp*y-sp*p[2],sp*y+cp*p[2]];}
function px(p){const r=rot(p),s=c.width*0.4;return [c.width/2+s*r[0],c.height/2-s*r[2]];}
function draw(){g.fillStyle='#fafafa';g.fillRect(0,0,c.width,c.height);
 for(const p of d.points){const q=px(p.slice(0,3));g.fillStyle=p[3];g.fillRect(q[0],q[1],2,2);}
 g.strokeStyle='#c0392b';g.lineWidth=1.5;
 for(const cam of d.cameras){const a=px(cam[0]),b=px(cam[1]);g.beginPath();g.moveTo(a[0],a[1]);
  g.lineTo(b[0],b[1]);g.stroke();g.fillStyle='#c0392b';g.fillRect(a[0]-2,a[1]-2,4,4);}}
c.addEventListener('mousedown',e=>{drag=[e.clientX,e.clientY];});
window.addEventListener('mouseup',()=>{drag=null;});
window.addEventListener('mousemove',e=>{if(!drag)return;yaw+=(e.clientX-drag[0])*0.01;
 pitch+=(e.clientY-drag[1])*0.01;drag=[e.clientX,e.clientY];draw();});
draw();})();"""


def scene_points(url: str, seed: int = 0) -> dict[str, Any]:
    """Cameras (centre and a point along the viewing axis) and up to ``MAX_POINTS`` sparse points
    (``[x, y, z, css colour]``), centred and scaled into the unit ball."""
    from raykit.store import open_store

    store = open_store(url)
    c2w = store.table.c2w
    centres, forward = c2w[:, :3, 3], c2w[:, :3, 2]  # OpenCV camera frame: z looks forward
    points = store.sparse_points()
    xyz = np.zeros((0, 3)) if points is None else points.xyz
    rgb = np.zeros((0, 3), np.uint8) if points is None else points.rgb
    if len(xyz) > MAX_POINTS:
        keep = np.random.default_rng(seed).choice(len(xyz), MAX_POINTS, replace=False)
        xyz, rgb = xyz[keep], rgb[keep]
    everything = np.concatenate([centres, xyz])
    middle = np.median(everything, axis=0)
    scale = float(np.percentile(np.linalg.norm(everything - middle, axis=1), 95)) or 1.0
    length = 0.15 * scale

    def unit(p: np.ndarray) -> list[float]:
        return [round(float(v), 4) for v in (p - middle) / scale]

    cameras = [[unit(c), unit(c + length * f)] for c, f in zip(centres, forward, strict=True)]
    dots = [[*unit(p), "#" + "".join(f"{int(v):02x}" for v in col)] for p, col in zip(xyz, rgb, strict=True)]
    return {"cameras": cameras, "points": dots}


def _inline(text: str) -> str:
    """Markdown inline text -> HTML: code spans (CommonMark: a run of n backticks up to the next run of
    exactly n; the content is text, one surrounding space stripped) and ``**bold**``; everything else
    escaped. No links and no images: inline markup cannot make the page fetch or embed anything."""
    parts, rest = [], text
    while (opening := re.search("`+", rest)) is not None:
        fence = opening.group()
        closing = next((m for m in re.finditer("`+", rest[opening.end() :]) if m.group() == fence), None)
        if closing is None:  # an unmatched fence is literal text
            parts.append(_text(rest[: opening.end()]))
            rest = rest[opening.end() :]
            continue
        body = rest[opening.end() : opening.end() + closing.start()]
        if len(body) > 1 and body.startswith(" ") and body.endswith(" ") and body.strip():
            body = body[1:-1]
        parts += [_text(rest[: opening.start()]), f"<code>{html.escape(body)}</code>"]
        rest = rest[opening.end() + closing.end() :]
    return "".join([*parts, _text(rest)])


def _text(text: str) -> str:
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", html.escape(text))


# An image the report embeds: a block of its own naming a PNG in OUT/figures, where only the pipeline
# writes; the file is read through ``fileio.safe_path`` (no link out of the folder) and bounded.
_FIGURE = re.compile(r"!\[([^\]\n]*)\]\(figures/([A-Za-z0-9_.-]+\.png)\)")
_FIGURE_LIMIT = 64 << 20


def markdown_html(text: str, figures: Path | None = None) -> str:
    """The markdown subset the sections use (paragraphs, pipe tables, inline code, bold) as HTML; a
    block that is exactly ``![alt](figures/NAME.png)`` embeds that file of folder ``figures`` (when
    given) as a data URI. Nothing else becomes an image or a link."""
    blocks = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        figure = _FIGURE.fullmatch(block.strip()) if figures is not None else None
        if figure is not None and figures is not None:
            alt, name = figure.groups()
            blocks.append(f'<img alt="{html.escape(alt)}" src="{_data_uri(figures, name)}">')
        elif lines and all(line.startswith("|") for line in lines):
            rows = [
                [c.strip() for c in line.strip("|").split("|")]
                for line in lines
                if not line.startswith("|---")
            ]
            head = "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
            blocks.append(f"<table><tr>{head}</tr>{body}</table>")
        elif lines:
            blocks.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(blocks)


def _data_uri(folder: Path, name: str) -> str:
    """PNG ``name`` of ``folder`` (a regular file inside it, at most 64 MiB) as a data URI."""
    try:
        data = read_bounded(safe_path(folder, name), limit=_FIGURE_LIMIT)
    except (OSError, UntrustedFileError) as exc:
        raise ConfigError(f"{folder / name}: figure not embedded in the report ({exc})") from None
    return "data:image/png;base64," + base64.b64encode(data).decode()


def write_html(
    out: Path,
    cfg: StageConfigs,
    results: Mapping[str, Any],
    records: Mapping[str, Any],
    extra: Mapping[str, str],
    made: Mapping[str, str],
) -> Path:
    """Write ``OUT/report.html`` (``made``: the figures' file names by key, see ``report.figures``)."""
    scene = json.dumps(scene_points(results["store"]["url"], cfg.run.seed)).replace("</", "<\\/")
    parts = ["<h1>raykit run report</h1>"]
    for title, body in {**sections(cfg, results, records), **extra}.items():
        parts.append(f"<h2>{html.escape(title)}</h2>")
        figures = [f"![{key}](figures/{made[key]})" for key in FIGURES.get(title, ())]
        parts.append(markdown_html("\n\n".join([body, *figures]), out / "figures"))
        if title == "Capture":
            parts.append(
                "<h3>Camera poses and sparse points (drag to rotate)</h3>"
                '<canvas id="scene" width="640" height="480"></canvas>'
            )
    page = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>raykit run report</title>'
        f"<style>{_CSS}</style></head><body>{''.join(parts)}"
        f'<script type="application/json" id="scene-data">{scene}</script><script>{_JS}</script>'
        "</body></html>"
    )
    path = out / "report.html"
    path.write_text(page)
    return path
