"""``raykit evaluate PRED GT``: layouts, store splits, results.json (hashes, protocol, same bytes), and
one line with exit status 2 and no results file for every bad input. The figures are checked against
nerfbaselines' values on the same images, committed in tests/data/oracles."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import raykit.cli
from raykit.cameras import Camera
from raykit.metrics import LPIPS, reference_lpips
from raykit.store import ImageRecord, SceneInfo, write_store

from ..data.oracles import cases
from ..data.oracles.cases import SIZE

_image, _noisy = cases.image, cases.noisy


def _save(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def _folders(root: Path, n: int = 3, prefix: str = "") -> tuple[Path, Path]:
    for i in range(n):
        gt = _image(i)
        _save(root / "gt" / f"r_{i}.png", gt)
        _save(root / "pred" / f"{prefix}r_{i}.png", _noisy(gt, 100 + i))
    return root / "pred", root / "gt"


def _evaluate(*args: str | Path, lpips: bool = False) -> int:
    return raykit.cli.main(["evaluate", *map(str, args), *([] if lpips else ["--no-lpips"])])


def _oracle(pred: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """nerfbaselines' PSNR and SSIM of one pair (committed: ``cases.evaluation_pairs``)."""
    psnr, ssim = cases.nerfbaselines_metrics(pred[None], gt[None])
    return float(psnr[0]), float(ssim[0])


def test_folders_results_match_nerfbaselines_and_hashes(tmp_path: Path) -> None:
    pred, gt = _folders(tmp_path)
    out = tmp_path / "results.json"
    assert _evaluate(pred, gt, "--output", out) == 0
    results = json.loads(out.read_text())
    assert results["n_images"] == 3 and results["protocol"]["name"] == "default"
    assert (
        results["protocol"]["ssim"]["kernel_size"] == 11 and results["raykit_version"] == raykit.__version__
    )
    for i, image in enumerate(results["images"]):
        pred_file, gt_file = pred / f"r_{i}.png", gt / f"r_{i}.png"
        nb_psnr, nb_ssim = _oracle(np.asarray(Image.open(pred_file)), np.asarray(Image.open(gt_file)))
        assert abs(image["psnr"] - nb_psnr) < 1e-5 and abs(image["ssim"] - nb_ssim) < 1e-5
        assert image["prediction_sha256"] == hashlib.sha256(pred_file.read_bytes()).hexdigest()
        assert image["ground_truth_sha256"] == hashlib.sha256(gt_file.read_bytes()).hexdigest()
    assert results["means"]["psnr"] == pytest.approx(np.mean([im["psnr"] for im in results["images"]]))
    lines = "".join(f"r_{i} {im['prediction_sha256']}\n" for i, im in enumerate(results["images"]))
    assert results["predictions"]["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    again = tmp_path / "again.json"
    assert _evaluate(pred, gt, "--output", again) == 0
    assert again.read_bytes() == out.read_bytes()


def test_raykit_render_names_and_lpips_nerf_protocol(tmp_path: Path) -> None:
    pred, gt = _folders(tmp_path, n=2, prefix="00")  # raykit's renders/SPLIT/NNN_NAME.png
    for i in range(2):
        (pred / f"00r_{i}.png").rename(pred / f"{i:03d}_r_{i}.png")
    weights = {}
    for net in ("alex", "vgg"):
        model, gen = LPIPS(net), torch.Generator().manual_seed(len(net))
        trunk = {
            f"features.{k}": torch.randn(v.shape, generator=gen) * 0.05
            for k, v in model.features.state_dict().items()
        }
        heads = {
            k: torch.rand(v.shape, generator=gen)
            for k, v in model.state_dict().items()
            if k.startswith("lin")
        }
        torch.save(trunk, tmp_path / f"{net}-t.pth")
        torch.save(heads, tmp_path / f"{net}-h.pth")
        weights[net] = (trunk, heads)
    flags = [
        f"--lpips-{n}-{p}={tmp_path / f'{n}-{p[0]}.pth'}" for n in ("alex", "vgg") for p in ("trunk", "heads")
    ]
    out = tmp_path / "r.json"
    assert _evaluate(pred, gt, "--output", out, "--protocol", "nerf", *flags, lpips=True) == 0
    results = json.loads(out.read_text())
    assert results["protocol"]["lpips"]["nets"] == ["alex", "vgg"]
    image = results["images"][1]
    assert image["prediction"].endswith("001_r_1.png")
    a = torch.from_numpy(np.array(Image.open(pred / "001_r_1.png")))[None]
    b = torch.from_numpy(np.array(Image.open(gt / "r_1.png")))[None]
    assert image["lpips"] == pytest.approx(
        float(reference_lpips(a, b, "alex", *weights["alex"])[0]), abs=1e-5
    )
    assert image["lpips_vgg"] == pytest.approx(
        float(reference_lpips(a, b, "vgg", *weights["vgg"])[0]), abs=1e-5
    )


def _store(path: Path, images: list[np.ndarray]) -> Path:
    camera = Camera("PINHOLE", SIZE[1], SIZE[0], (30.0, 30.0, SIZE[1] / 2, SIZE[0] / 2))
    records = []
    for i, image in enumerate(images):
        c2w = np.eye(4)
        c2w[0, 3] = i
        split = "train" if i == 0 else "test"
        records.append(
            ImageRecord(f"v_{i}.png", split, camera, c2w, 0.5, 5.0, f"mem://{i}", lambda im=image: im)
        )
    write_store(
        path, records, scene=SceneInfo(bounds=((-1.0,) * 3, (1.0,) * 3)), backend="zarr", chunk_rays=256
    )
    return path


def test_store_split_ground_truth_composited_on_background(tmp_path: Path) -> None:
    rgba = [_image(10 + i, channels=4) for i in range(3)]
    store = _store(tmp_path / "s.zarr", rgba)
    for i in (1, 2):
        _save(tmp_path / "pred" / f"v_{i}.png", _noisy(rgba[i], i))
    for background, colour in (("white", 255), ("black", 0)):
        out = tmp_path / f"{background}.json"
        assert _evaluate(tmp_path / "pred", f"{store}:test", "--output", out, "--background", background) == 0
        results = json.loads(out.read_text())
        assert results["ground_truth"]["kind"] == "store" and results["ground_truth"]["split"] == "test"
        assert results["background"] == [colour] * 3
        for image, i in zip(results["images"], (1, 2), strict=True):
            gt = cases.composite(rgba[i], colour)
            pred = np.asarray(Image.open(tmp_path / "pred" / f"v_{i}.png"))
            assert image["psnr"] == pytest.approx(_oracle(pred, gt)[0], abs=1e-5)


def test_ns_render_and_gsplat_layouts(tmp_path: Path) -> None:
    ns = tmp_path / "ns" / "test"
    for i in range(2):
        gt = _image(i)
        _save(ns / "gt-rgb" / "images" / f"frame_{i}.png", gt)
        _save(ns / "rgb" / "images" / f"frame_{i}.png", _noisy(gt, i))
    assert _evaluate(tmp_path / "ns", tmp_path / "ns", "--output", tmp_path / "ns.json") == 0
    results = json.loads((tmp_path / "ns.json").read_text())
    assert results["predictions"]["layout"] == "ns-render" and results["n_images"] == 2
    assert results["images"][0]["name"] == "images/frame_0"
    renders = tmp_path / "renders"
    expected = []
    for i in range(3):
        gt, pred = _image(i), _noisy(_image(i), i)
        _save(renders / f"val_step6999_{i:04d}.png", np.zeros((SIZE[0], 2 * SIZE[1], 3), np.uint8))
        _save(renders / f"val_step29999_{i:04d}.png", np.concatenate([gt, pred], axis=1))
        _save(tmp_path / "gsgt" / f"img_{i:03d}.png", gt)
        expected.append(_oracle(pred, gt)[0])
    for gt_arg in (renders, tmp_path / "gsgt"):
        assert _evaluate(renders, gt_arg, "--output", tmp_path / "gs.json") == 0
        results = json.loads((tmp_path / "gs.json").read_text())
        assert results["predictions"]["layout"] == "gsplat" and results["predictions"]["gsplat_step"] == 29999
        assert [im["psnr"] for im in results["images"]] == pytest.approx(expected, abs=1e-5)


def _one_error_line(capsys: pytest.CaptureFixture[str], out: Path, *args: str | Path) -> str:
    assert _evaluate(*args, "--output", out) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raykit: error: ")
    return err[0]


def test_bad_inputs_are_one_line_exit_2_no_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pred, gt = _folders(tmp_path)
    out = tmp_path / "results.json"
    (pred / "r_2.png").unlink()
    assert "r_2.png: no prediction" in _one_error_line(capsys, out, pred, gt)
    _save(pred / "r_2.png", _image(2))
    _save(pred / "r_9.png", _image(9))
    assert "r_9.png: a prediction with no ground-truth image" in _one_error_line(capsys, out, pred, gt)
    (pred / "r_9.png").unlink()
    _save(pred / "r_1.png", np.zeros((SIZE[0] + 1, SIZE[1], 3), np.uint8))
    line = _one_error_line(capsys, out, pred, gt)
    assert "r_1.png: size 40x33 differs" in line
    _save(pred / "r_1.png", _image(1))
    (pred / "r_0.png").write_bytes(b"not a png")
    assert "r_0.png: not a readable image" in _one_error_line(capsys, out, pred, gt)
    (pred / "r_0.png").unlink()
    (pred / "notes.bin").write_bytes(b"x")
    assert "notes.bin: not an image" in _one_error_line(capsys, out, pred, gt)
    (pred / "notes.bin").unlink()
    floats = np.full((*SIZE, 3), 0.5, np.float32)
    floats[3, 4, 1] = np.nan
    np.save(pred / "r_0.npy", floats)
    assert "r_0.npy: NaN or infinity" in _one_error_line(capsys, out, pred, gt)
    floats[3, 4, 1] = np.inf
    np.save(pred / "r_0.npy", floats)
    assert "r_0.npy: NaN or infinity" in _one_error_line(capsys, out, pred, gt)
    store = _store(tmp_path / "s.zarr", [_image(i) for i in range(2)])
    assert f"{store}:val: the store has no split 'val'" in _one_error_line(capsys, out, pred, f"{store}:val")


def test_float_predictions_are_quantised_like_nerfbaselines(tmp_path: Path) -> None:
    pred, gt = _folders(tmp_path, n=1)
    floats = np.asarray(Image.open(pred / "r_0.png")).astype(np.float32) / 255 + 0.3 / 255
    (pred / "r_0.png").unlink()
    np.save(pred / "r_0.npy", floats)
    assert _evaluate(pred, gt, "--output", tmp_path / "f.json") == 0
    image = json.loads((tmp_path / "f.json").read_text())["images"][0]
    quantised = (floats * 255).clip(0, 255).astype(np.uint8)
    assert image["psnr"] == pytest.approx(
        _oracle(quantised, np.asarray(Image.open(gt / "r_0.png")))[0], abs=1e-5
    )


def test_ns_render_against_a_store_split_by_stem(tmp_path: Path) -> None:
    """ns-render names images by their path under the capture's images folder; a store by its own name:
    a prediction matches the one ground-truth image of its stem."""
    images = [_image(20 + i) for i in range(3)]
    store = _store(tmp_path / "s.zarr", images)
    for i in (1, 2):
        _save(tmp_path / "ns" / "test" / "gt-rgb" / "images" / f"v_{i}.png", images[i])
        _save(tmp_path / "ns" / "test" / "rgb" / "images" / f"v_{i}.png", _noisy(images[i], i))
    out = tmp_path / "r.json"
    assert _evaluate(tmp_path / "ns", f"{store}:test", "--output", out) == 0
    results = json.loads(out.read_text())
    assert [im["name"] for im in results["images"]] == ["v_1", "v_2"]
    assert results["predictions"]["layout"] == "ns-render" and results["ground_truth"]["kind"] == "store"
