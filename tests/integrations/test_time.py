"""Time through the integrations (issue 58): the nerfstudio dataparser fills ``Cameras.times`` as
nerfstudio's own D-NeRF parser does on the same capture, its ray bundles carry them, and the gsplat
dataset's items hand each view's time to the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from raykit.integrations.gsplat import Dataset, Parser


@pytest.fixture
def _nerfstudio() -> None:
    """nerfstudio's D-NeRF parser and raykit's for the tests that compare with it, each skipping on
    its own when nerfstudio is missing."""
    global dnerf_parser, RayGenerator, RaykitDataParserConfig
    dnerf_parser = pytest.importorskip("nerfstudio.data.dataparsers.dnerf_dataparser")
    from nerfstudio.model_components.ray_generators import RayGenerator

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig


@pytest.mark.usefixtures("_nerfstudio")
@pytest.mark.parametrize("form", ["rays", "images_wds"])
def test_cameras_times_match_nerfstudios_dnerf_parser(dnerf: dict[str, Any], form: str) -> None:
    theirs = dnerf_parser.DNeRFDataParserConfig(data=dnerf["capture"]).setup()
    ours = RaykitDataParserConfig(data=dnerf[form]).setup()
    for split in ("train", "val", "test"):
        mine, stock = ours.get_dataparser_outputs(split), theirs.get_dataparser_outputs(split)
        their_times = {
            Path(str(f)).stem: float(t)
            for f, t in zip(stock.image_filenames, stock.cameras.times, strict=True)
        }
        assert mine.cameras.times is not None and mine.cameras.times.shape == (len(their_times), 1)
        names = [Path(n).stem for n in mine.metadata["raykit_names"]]
        assert [float(t) for t in mine.cameras.times[:, 0]] == [their_times[n] for n in names]
        # nerfstudio's ray generator hands each ray its camera's time
        bundle = RayGenerator(mine.cameras)(torch.tensor([[1, 0, 0], [0, 3, 4]]))
        assert torch.equal(bundle.times[:, 0], mine.cameras.times[[1, 0], 0])


@pytest.mark.usefixtures("_nerfstudio")
def test_static_store_has_no_camera_times(tmp_path: Path) -> None:
    from raykit.converters import convert

    lego = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"
    convert(lego, tmp_path / "lego.zarr")
    out = RaykitDataParserConfig(data=tmp_path / "lego.zarr").setup().get_dataparser_outputs("train")
    assert out.cameras.times is None


def test_gsplat_items_carry_their_views_time(dnerf: dict[str, Any]) -> None:
    scene = dnerf["scene"]
    times = {f"{n}.png": float(t) for n, t in zip(scene.names, scene.times, strict=True)}
    parser = Parser(str(dnerf["images"]))
    dataset = Dataset(parser, "train")
    for item in range(len(dataset)):
        data = dataset[item]
        name = parser.image_names[int(dataset.indices[item])]
        assert data["time"].dtype == torch.float32 and float(data["time"]) == pytest.approx(times[name])
    batch = torch.utils.data.default_collate([dataset[0], dataset[1]])
    assert batch["time"].shape == (2,)


@pytest.mark.usefixtures("_nerfstudio")
def test_ray_datamanager_bundles_carry_times(dnerf: dict[str, Any]) -> None:
    """raykit's ray datamanager hands each ray its camera's time, as nerfstudio's ray generator does."""
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    ours = RaykitDataManagerConfig(
        dataparser=RaykitDataParserConfig(data=dnerf["rays"]), train_num_rays_per_batch=256,
        eval_num_rays_per_batch=256,
    ).setup(device="cpu")  # fmt: skip
    bundle, batch = ours.next_train(0)
    expected = RayGenerator(ours.train_dataset.cameras)(batch["indices"])
    assert bundle.times is not None and torch.equal(bundle.times, expected.times)
    assert len(set(bundle.times[:, 0].tolist())) > 1
