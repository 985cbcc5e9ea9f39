"""The one report model of raykit (run, sweep and demo reports) and its two renderings.

A report is a title and sections; a section holds blocks of plain data (named tuples, so a report is
JSON as it is: the pipeline fingerprints the sections it is given): paragraphs of text and literal
``Code`` spans, tables of text cells, figures (PNGs in ``OUT/figures``), videos (an MP4, or an
animated GIF, in ``OUT/figures``: played inline, looping) and the 3-D view of a run's cameras and
points. Jinja2 renders it twice, from ``raykit/templates``: ``report.md`` (every piece of text escaped
for CommonMark, every literal in one code span) and one self-contained ``report.html`` (autoescaped;
figures and videos read through ``fileio.safe_path`` and embedded as data URIs, inline CSS and JS:
nothing is fetched when it is viewed). Names from a capture or a store reach either file only as text.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jinja2

from raykit.errors import ConfigError
from raykit.fileio import UntrustedFileError, atomic_path, atomic_write_bytes, read_bounded, safe_path

__all__ = [
    "Block",
    "Code",
    "Figure",
    "Paragraph",
    "Scene",
    "Section",
    "Table",
    "Video",
    "para",
    "pyplot",
    "save_figure",
    "write_report",
]

FIGURE_NAME = re.compile(r"[A-Za-z0-9_.-]+\.(png|mp4|gif)")  # a file the report's writer made in OUT/figures
MEDIA_TYPES = {"png": "image/png", "mp4": "video/mp4", "gif": "image/gif"}
FIGURE_LIMIT = 64 << 20


class Code(NamedTuple):
    """A literal (a file name, a key): shown as it is, in one code span."""

    text: str


class Paragraph(NamedTuple):
    parts: tuple[str | Code, ...]


class Table(NamedTuple):
    header: list[str]
    rows: list[list[str]]


class Figure(NamedTuple):
    """PNG ``name`` in ``OUT/figures``."""

    name: str
    alt: str


class Video(NamedTuple):
    """MP4 (or animated GIF) ``name`` in ``OUT/figures``: played inline, muted and looping, in report.html;
    a link in report.md."""

    name: str
    alt: str


class Scene(NamedTuple):
    """The run's camera poses and sparse points, ``{"cameras": [[centre, ahead]], "points": [[x, y, z,
    css colour]]}`` in the unit ball: a canvas to drag in report.html, a pointer to it in report.md."""

    data: dict[str, Any]


Block = Paragraph | Table | Figure | Video | Scene


class Section(NamedTuple):
    title: str
    blocks: list[Block]


def para(*parts: str | Code) -> Paragraph:
    return Paragraph(parts)


def printable(text: object) -> str:
    """Control characters written as escapes (a newline as ``\\n``): no break, no new block."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def md_text(text: object) -> str:
    """Text in CommonMark: every character that could start markup backslash-escaped (``_`` only
    where it could: not between two letters or digits, as in ``test_psnr``)."""
    return re.sub(r"[\\`*\[\]<>!|&#~]|(?<![^\W_])_|_(?![^\W_])", lambda m: "\\" + m.group(), printable(text))


def md_code(text: object) -> str:
    """One code span that shows ``text`` literally and cannot end early: a fence of one backtick more
    than the longest run inside, padded with a space where the text starts or ends with a backtick
    or a space. Inside a code span nothing is markup: ``![x](/etc/passwd)`` stays text."""
    text = printable(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _data_uri(folder: Path, name: str) -> str:
    """Figure or video ``name`` of ``folder`` (a regular file inside it, at most 64 MiB) as a data URI."""
    try:
        if not FIGURE_NAME.fullmatch(name):
            raise UntrustedFileError(f"not a figure name: {name!r}")
        data = read_bounded(safe_path(folder, name), limit=FIGURE_LIMIT)
    except (OSError, UntrustedFileError) as exc:
        raise ConfigError(f"{folder / name}: figure not embedded in the report ({exc})") from None
    media = MEDIA_TYPES[name.rpartition(".")[2]]
    return f"data:{media};base64," + base64.b64encode(data).decode()


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(kind=lambda block: type(block).__name__, printable=printable, md=md_text, code=md_code)
    env.tests["code"] = lambda part: isinstance(part, Code)
    return env


def render(title: str, sections: Sequence[Section], figures: Path) -> tuple[str, str]:
    """``(report.md, report.html)`` of the report; figures are read from folder ``figures``."""
    data = {
        b.name: _data_uri(figures, b.name)
        for s in sections
        for b in s.blocks
        if isinstance(b, Figure | Video)
    }
    context = {"title": title, "sections": sections}
    markdown = _environment(False).get_template("report.md.j2").render(context)
    page = _environment(True).get_template("report.html.j2").render(context, data=data)
    return re.sub(r"\n{3,}", "\n\n", markdown).strip() + "\n", page


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Lay out matplotlib figure ``fig``, write it to ``path`` as a PNG (atomically) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    pyplot().close(fig)
    return path


def write_report(out: Path, title: str, sections: Sequence[Section]) -> tuple[Path, Path]:
    """Write ``OUT/report.md`` and ``OUT/report.html`` (figures from ``OUT/figures``); their paths."""
    markdown, page = render(title, sections, out / "figures")
    paths = out / "report.md", out / "report.html"
    for path, text in zip(paths, (markdown, page), strict=True):
        atomic_write_bytes(path, text.encode(), sync=False)
    return paths
