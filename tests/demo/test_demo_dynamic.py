"""``raykit demo --dynamic``'s stage on its own, with a token budget: the dynamic scene converted, both
fields trained and evaluated on it, its plot and video made, and its report section built from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import av

from raykit.demo import plan_for
from raykit.demo.dynamic import FIELDS, dynamic_section, dynamic_stage
from raykit.pipeline import StageRunner
from raykit.report import Figure, Table, Video, write_report
from raykit.trainer import TrainConfig

TINY = TrainConfig(batch_size=256, levels=2, base_resolution=8, max_resolution=16, features=2, hidden=16,
                   occ_resolution=16, march_steps=48, device="cpu")  # fmt: skip


def test_the_dynamic_stage_compares_the_fields_and_feeds_its_section(tmp_path: Path) -> None:
    plan = dataclasses.replace(plan_for(True), dynamic_seconds=0.01)  # one step per field
    runner = StageRunner(tmp_path, echo=lambda line: None)
    result = runner.execute(dynamic_stage(tmp_path, plan, 0, ["raykit", "demo"], TINY))
    assert list(result["runs"]) == list(FIELDS) and result["views"] == {"train": 18, "val": 3, "test": 3}
    for field, run in result["runs"].items():
        assert run["field"] == field and run["step"] >= 1 and len(run["frames"]) == 3
        assert (Path(run["run_dir"]) / "renders" / "test" / run["frames"][0]["file"]).is_file()
    video = result["video"]
    assert video["columns"] == ["truth", *FIELDS] and video["times"] == [0.2, 0.6, 1.0]
    with av.open(video["path"]) as container:
        assert sum(1 for _ in container.decode(video=0)) == 3
    section = dynamic_section(result)
    (table,) = [b for b in section.blocks if isinstance(b, Table)]
    assert [row[0] for row in table.rows] == list(FIELDS)
    assert table.rows[1][1] == f"{result['runs']['kplanes']['psnr']:.2f}"
    media = [b.name for b in section.blocks if isinstance(b, Figure | Video)]
    assert media == ["dynamic_psnr_time.png", "dynamic_test_camera.mp4"]
    markdown, _ = write_report(tmp_path, "demo", [section])  # every file it names is there to embed
    assert "dynamic_test_camera.mp4" in markdown.read_text()
