"""raykit.report: one model, two renderings; text from a capture stays text in both."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.errors import ConfigError
from raykit.report import Code, Figure, Scene, Section, Table, Video, para, write_report

HOSTILE = [
    "![x](/etc/passwd)",
    "a`b``c",
    "<script>alert(1)</script>",
    "*em* _u_ [l](http://x) &amp; #\n\n# h",
]


def _report(out: Path, figure: str = "plot.png") -> tuple[str, str]:
    (out / "figures").mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 6, 3), 90, np.uint8)).save(out / "figures" / "plot.png")
    sections = [
        Section(HOSTILE[3], [para("text ", HOSTILE[0], " and ", Code(HOSTILE[1]), " ", Code(HOSTILE[2]))]),
        Section("Table", [Table(["test_psnr", "a|b"], [[HOSTILE[0], "1 | 2"], [HOSTILE[2], HOSTILE[3]]])]),
        Section(
            "Figure", [Figure(figure, HOSTILE[2]), Scene({"cameras": [], "points": [[0, 0, 0, "</script>"]]})]
        ),
    ]
    md, html = write_report(out, "title <b>", sections)
    return md.read_text(), html.read_text()


def test_markdown_keeps_every_name_as_text(tmp_path: Path) -> None:
    markdown_it = pytest.importorskip("markdown_it")  # an independent CommonMark parser (via rich)
    md, _ = _report(tmp_path)
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert re.findall(r"<img [^>]*>", html) == [
        '<img src="figures/plot.png" alt="&lt;script&gt;alert(1)&lt;/script&gt;" />'
    ]
    assert "<a " not in html and "<em>" not in html and "<script" not in html and html.count("<h1>") == 1
    assert "<code>a`b``c</code>" in html and "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>" in html
    assert "| test_psnr | a\\|b |" in md and "<th>test_psnr</th>" in html  # no needless escape
    assert "<td>![x](/etc/passwd)</td>" in html and "<td>1 | 2</td>" in html and "<th>a|b</th>" in html
    assert "*em* _u_ [l](http://x) &amp;amp; #\\n\\n# h" in html  # the heading, shown as written


def test_html_is_autoescaped_and_self_contained(tmp_path: Path) -> None:
    _, html = _report(tmp_path)
    assert html.count("<script") == 2  # the 3-D view's data and its drawing code, nothing from the text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<code>a`b``c</code>" in html
    assert re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,', html) == [
        "&lt;script&gt;alert(1)&lt;/script&gt;"
    ]
    assert "\\u003c/script\\u003e" in html  # the scene's JSON cannot close its script element
    assert re.findall(r'(?:src|href)="(?!data:)', html) == []


@pytest.mark.parametrize("name", ["../secret.png", "missing.png", "link.png", "plot.svg"])
def test_only_pngs_the_writer_made_in_figures_are_embedded(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret.png").write_bytes(b"\x89PNG secret")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "link.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(ConfigError, match="figure not embedded in the report") as caught:
        _report(tmp_path, name)
    assert "\n" not in str(caught.value) and not (tmp_path / "report.html").exists()


@pytest.mark.parametrize(("name", "media"), [("clip.mp4", "video/mp4"), ("clip.gif", "image/gif")])
def test_a_video_plays_inline_in_html_and_is_linked_from_markdown(
    tmp_path: Path, name: str, media: str
) -> None:
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / name).write_bytes(b"clip bytes")
    md, html = write_report(tmp_path, "t", [Section("Video", [Video(name, HOSTILE[2])])])
    page = html.read_text()
    data = "data:" + media + ";base64," + base64.b64encode(b"clip bytes").decode()
    tag = "video controls autoplay loop muted playsinline aria-label" if name.endswith(".mp4") else "img alt"
    assert page.count(f'<{tag}="&lt;script&gt;alert(1)&lt;/script&gt;" src="{data}"') == 1
    assert f"(figures/{name}) (a video; it plays in `report.html`)" in md.read_text()
