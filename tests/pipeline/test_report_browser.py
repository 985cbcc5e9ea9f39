"""report.html in a real headless browser (chromium over the DevTools protocol).

Loads with no console error and no request leaving the page, every image decodes and shows something
(its screenshot is not blank), and the 3-D view of cameras and points changes when dragged.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websocket
from PIL import Image

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (apt-get install chromium) to load report.html in"
)


class DevTools:
    """One page of a headless chromium: ``call`` a protocol method, ``events`` seen so far."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self.next_id, self.events = 0, []  # type: ignore[var-annotated]

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result
            self.events.append(message)

    def wait_for(self, method: str, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} within {seconds} s"
            self.events.append(json.loads(self.ws.recv()))

    def evaluate(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply
        return reply["result"].get("value")

    def screenshot(self, clip: dict[str, float]) -> np.ndarray:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={**clip, "scale": 1})  # fmt: skip
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("L"), np.float64)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    profile = tmp_path_factory.mktemp("chromium")
    proc = subprocess.Popen(
        [str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--window-size=1200,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as reply:
            target = next(t for t in json.load(reply) if t["type"] == "page")
        tools = DevTools(target["webSocketDebuggerUrl"])
        yield tools
        tools.ws.close()
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def loaded(page: DevTools, colmap_run: Path) -> DevTools:
    for domain in ("Page", "Runtime", "Log", "Network"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", url=(colmap_run / "report.html").as_uri())
    page.wait_for("Page.loadEventFired")
    return page


def test_page_loads_without_errors_or_network(loaded: DevTools) -> None:
    errors = [e for e in loaded.events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [
        e
        for e in loaded.events
        if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")
    ]
    errors += [
        e
        for e in loaded.events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]
    assert errors == []
    urls = [
        e["params"]["request"]["url"] for e in loaded.events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls
    headings = loaded.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    for title in (
        "Capture",
        "Loader throughput",
        "Training",
        "Test views",
        "Export verification",
        "Stage times",
    ):
        assert title in headings


def _rect(page: DevTools, selector: str, index: int = 0) -> dict[str, float]:
    rect = page.evaluate(
        f"(() => {{ const r = document.querySelectorAll({selector!r})[{index}].getBoundingClientRect();"
        " return {x: r.left + window.scrollX, y: r.top + window.scrollY,"
        " width: r.width, height: r.height}; })()"
    )
    assert rect["width"] > 10 and rect["height"] > 10, rect
    return dict(rect)


def test_every_image_and_plot_shows(loaded: DevTools) -> None:
    images = loaded.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
    assert {alt for alt, _, _ in images} >= {"loader", "psnr", "samplers", "renders", "stages"}
    assert any(alt.endswith(": sampling map") for alt, _, _ in images)  # --ray-sampling loss
    for index, (alt, complete, width) in enumerate(images):
        assert complete and width > 0, alt
        assert loaded.screenshot(_rect(loaded, "img", index)).std() > 5.0, f"{alt} is blank on screen"


def test_the_3d_view_shows_cameras_and_points_and_turns_when_dragged(loaded: DevTools) -> None:
    data = loaded.evaluate("JSON.parse(document.getElementById('scene-data').textContent)")
    assert len(data["cameras"]) == 12 and len(data["points"]) > 100
    loaded.evaluate("document.getElementById('scene').scrollIntoView()")
    rect = loaded.evaluate("(() => { const r = document.getElementById('scene').getBoundingClientRect();"
                           " return [r.left, r.top, r.width, r.height]; })()")  # fmt: skip
    pixels = "document.getElementById('scene').toDataURL()"
    before = loaded.evaluate(pixels)
    drawn = loaded.screenshot(_rect(loaded, "#scene"))
    assert (np.abs(drawn - np.median(drawn)) > 30).mean() > 0.002, "the 3-D view is empty"
    x, y = rect[0] + rect[2] / 2, rect[1] + rect[3] / 2
    loaded.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
    for step in range(1, 9):
        loaded.call(
            "Input.dispatchMouseEvent", type="mouseMoved", x=x + 10 * step, y=y + 4 * step, button="left"
        )
    loaded.call(
        "Input.dispatchMouseEvent", type="mouseReleased", x=x + 80, y=y + 32, button="left", clickCount=1
    )
    assert loaded.evaluate(pixels) != before
