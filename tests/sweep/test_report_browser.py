"""The sweep's report.html in a real headless browser, as the run report is tested
(tests/pipeline/test_report_browser.py: its chromium and DevTools client are used here as they are).

Loads with no console error and no request leaving the page; its tables and every figure show.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[1] / "pipeline" / "test_report_browser.py"
_spec = importlib.util.spec_from_file_location("raykit_tests_report_browser", _PATH)
assert _spec is not None and _spec.loader is not None
browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(browser)

pytestmark = browser.pytestmark
page = browser.page  # the module's chromium page fixture


@pytest.fixture(scope="module")
def loaded(page: Any, local_sweep: tuple[Path, Path]) -> Iterator[Any]:
    for domain in ("Page", "Runtime", "Log", "Network"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", url=(local_sweep[1] / "report.html").as_uri())
    page.wait_for("Page.loadEventFired")
    yield page


def test_page_loads_without_errors_or_network(loaded: Any) -> None:
    errors = [e for e in loaded.events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [
        e for e in loaded.events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]  # fmt: skip
    assert errors == []
    urls = [
        e["params"]["request"]["url"] for e in loaded.events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls
    headings = loaded.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    assert headings == ["Runs", "Capture: tiny", "Paired comparison", "Costs"]
    cells = loaded.evaluate("Array.from(document.querySelectorAll('td')).map(c => c.textContent)")
    assert "sampler=occupancy" in cells and any("±" in c for c in cells)


def test_the_curves_show(loaded: Any) -> None:
    images = loaded.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
    assert [alt for alt, _, _ in images] == ["curves tiny"]
    for index, (alt, complete, width) in enumerate(images):
        assert complete and width > 0, alt
        shot = loaded.screenshot(browser._rect(loaded, "img", index))
        assert shot.std() > 5.0, f"{alt} is blank on screen"
