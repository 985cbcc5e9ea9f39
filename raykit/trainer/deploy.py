"""Rendering from an exported model alone, and checking an export against its run's evaluation.

``raykit render --model OUT --cameras STORE|transforms.json --out DIR`` renders every view of a store
split (with PSNR/SSIM, since the store holds the pixels) or every frame of a ``transforms.json``
(instant-ngp / nerfstudio / Blender; no store needed) into ``DIR/NNN_NAME.png`` plus ``DIR/render.json``
(``DIR/NNN_CAMERA_tTIME.png`` at a view with a time: ``raykit.evaluation.render_stem``).
Cameras are mapped into the model's frame: a ``transforms.json`` is in the capture's frame and goes
through the export's ``world_from_source``; a store whose frame differs from the export's goes through
the capture's frame too. New cameras get the training store's near/far range. A time-conditioned
model (``--field kplanes``) renders a store's view at that view's time and a ``transforms.json`` frame at
its ``time`` (required there, as in D-NeRF's files).

``raykit export --verify`` (:func:`verify_export`) re-renders the images of the run's evaluation from
the export and the store and fails unless the mean PSNR of each verified split is within ``tolerance_db``
(0.05 dB) of the run's ``eval.json``. Both use :func:`raykit.trainer.inference.render_colours`, the path
of the run's own evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raykit.camera_json import INTRINSIC_KEYS, camera_from_intrinsics, image_size
from raykit.cameras import pixels_to_rays
from raykit.conventions import opengl_to_opencv_c2w
from raykit.errors import ExportError, SourceError
from raykit.evaluation import render_stem
from raykit.fileio import atomic_write_json
from raykit.imagedecode import open_image
from raykit.metrics import Scorer, protocol_of, psnr
from raykit.rays import UNKNOWN_FAR, RayBatch
from raykit.store import RayStore
from raykit.trainer.evaluate import image_mask, image_rays_and_pixels, models_from_state, save_render
from raykit.trainer.exported import ExportedModel, load_export
from raykit.trainer.inference import render_colours
from raykit.trainer.runtime import parse_background, resolve_device

__all__ = ["View", "render_export", "store_views", "transforms_views", "verify_export"]


@dataclass
class View:
    """One image to render: its rays in the model's frame and, from a store, its target pixels."""

    name: str
    rays: RayBatch
    height: int
    width: int
    target: torch.Tensor | None = None  # (H, W, 3) over the model's background, on the CPU
    stored: np.ndarray | None = None  # (H, W, 3|4) uint8: the store's image, scored by the protocol
    mask: np.ndarray | None = None  # (H, W) uint8: the store's mask (a masked evaluation), or None
    stem: str = ""  # the render's file stem (default: the name's stem)


def _map_rays(rays: RayBatch, model_from_store: np.ndarray) -> RayBatch:
    """Rays of one world frame in another (a similarity ``s * R | t``); the identity returns ``rays``."""
    if np.allclose(model_from_store, np.eye(4), atol=1e-12):
        return rays
    scale = float(np.cbrt(np.linalg.det(model_from_store[:3, :3])))
    a = torch.as_tensor(model_from_store[:3, :3], dtype=torch.float32, device=rays.origins.device)
    t = torch.as_tensor(model_from_store[:3, 3], dtype=torch.float32, device=rays.origins.device)
    directions = rays.directions @ a.T
    return dataclasses.replace(
        rays,
        origins=rays.origins @ a.T + t,
        directions=directions / directions.norm(dim=-1, keepdim=True),
        near=rays.near * scale,
        far=rays.far * scale,
        extra={},
    )


def store_views(
    model: ExportedModel, store: RayStore, split: str, device: torch.device, names: list[str] | None = None
) -> Iterator[View]:
    """The views of ``split`` (or of ``names``) of a store, with targets over the model's background."""
    if split not in store.splits:
        raise ExportError(f"{store.url}: no split {split!r} (has {', '.join(sorted(store.splits))})")
    model_from_store = model.world_from_source @ np.linalg.inv(np.asarray(store.world_from_source))
    background = parse_background(model.config.background).to(device)
    for name in store.images(split) if names is None else names:
        index = store.image_index(name)
        height, width = int(store.table.height[index]), int(store.table.width[index])
        rays, stored = image_rays_and_pixels(store, name, device)  # the image read once
        target = rays.composite(background).view(height, width, 3).cpu()
        mask = image_mask(store, name)
        stem = render_stem(store, name)
        yield View(name, _map_rays(rays, model_from_store), height, width, target, stored, mask, stem)


def _frame_size(intr: Mapping[str, Any], frame: Mapping[str, Any], base: Path) -> tuple[int, int]:
    if "w" in intr and "h" in intr:
        return image_size(intr["w"], intr["h"])
    file_path = str(frame.get("file_path", "")).replace("\\", "/")
    candidates = [base / file_path, *(base / (file_path + ext) for ext in (".png", ".jpg", ".jpeg"))]
    for candidate in candidates:
        if file_path and candidate.is_file():
            with open_image(candidate) as image:
                return image.size
    raise SourceError(f"no w/h given and no image at file_path {file_path!r} to take the size from")


def _c2w(value: Any) -> np.ndarray:
    """A transforms.json ``transform_matrix`` (OpenGL, 3x4 or 4x4) -> (4, 4) OpenCV camera-to-world."""
    matrix = np.asarray(value, dtype=np.float64)
    if matrix.shape not in ((3, 4), (4, 4)) or not np.all(np.isfinite(matrix)):
        raise SourceError(f"transform_matrix: expected a finite 3x4 or 4x4 matrix, got shape {matrix.shape}")
    c2w = np.eye(4)
    c2w[:3] = matrix[:3]
    rotation = c2w[:3, :3]
    if not np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-4) or np.linalg.det(rotation) <= 0:
        raise SourceError("transform_matrix: rotation is not orthonormal and right-handed")
    return opengl_to_opencv_c2w(c2w)


def transforms_views(
    model: ExportedModel, path: str | os.PathLike[str], device: torch.device
) -> Iterator[View]:
    """Every frame of a ``transforms.json`` as a view in the model's frame (no targets); bad frames:
    one ``SourceError`` listing every problem, naming the file and the frames."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: unreadable transforms file: {exc}") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list):
        raise SourceError(f"{path}: expected an object with a 'frames' list")
    frames, problems = [], dict[str, list[int]]()
    for i, frame in enumerate(meta["frames"]):
        try:
            if not isinstance(frame, dict):
                raise SourceError("expected an object")
            intr = {k: frame.get(k, meta.get(k)) for k in INTRINSIC_KEYS if k in frame or k in meta}
            width, height = _frame_size(intr, frame, path.parent)
            camera = camera_from_intrinsics(intr, width, height, label=str(path))
            time = _frame_time(frame, model.config.field == "kplanes")
            frames.append((_frame_name(frame, i), camera, _c2w(frame.get("transform_matrix")), time))
        except (SourceError, ValueError, TypeError) as exc:
            for problem in getattr(exc, "problems", [str(exc)]):
                problems.setdefault(problem, []).append(i)  # a problem many frames share: said once
    if problems:
        raise SourceError([f"{path}: {_frames(indices)}: {problem}" for problem, indices in problems.items()])
    world = model.world_from_source
    scene = model.manifest["scene"]
    near, far = scene.get("near") or 0.0, scene.get("far") or UNKNOWN_FAR
    for name, camera, c2w_source, time in frames:
        c2w = world @ c2w_source
        c2w[:3, :3] /= float(np.cbrt(np.linalg.det(world[:3, :3])))
        yield _camera_view(name, camera, c2w, near, far, device, time)


def _frame_time(frame: Mapping[str, Any], timed: bool) -> float | None:
    """A frame's ``time`` for a time-conditioned model (required there), else None."""
    if not timed:
        return None
    time = frame.get("time")
    if isinstance(time, bool) or not isinstance(time, int | float) or not np.isfinite(time):
        raise SourceError(f"time: expected a finite number (the model is time-conditioned), got {time!r}")
    return float(time)


def _frames(indices: list[int]) -> str:
    """``frame 3``, or ``4 frames (0, 1, 2, ...)``."""
    if len(indices) == 1:
        return f"frame {indices[0]}"
    shown = ", ".join(str(i) for i in indices[:3]) + (", ..." if len(indices) > 3 else "")
    return f"{len(indices)} frames ({shown})"


def _frame_name(frame: Mapping[str, Any], index: int) -> str:
    stem = Path(str(frame.get("file_path", "")).replace("\\", "/")).stem
    return stem or f"frame_{index:04d}"


def _camera_view(
    name: str,
    camera: Any,
    c2w: np.ndarray,
    near: float,
    far: float,
    device: torch.device,
    time: float | None = None,
) -> View:
    """All pixels of one camera, row-major, as a ray batch on ``device`` (at ``time`` when given)."""
    ys, xs = torch.meshgrid(torch.arange(camera.height), torch.arange(camera.width), indexing="ij")
    pixels = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
    origins, directions, z_scale = pixels_to_rays(camera, torch.as_tensor(c2w), pixels, dtype=torch.float32)
    n = pixels.shape[0]
    stem = Path(name).stem if time is None else f"{Path(name).stem}_t{time:.4f}"
    rays = RayBatch(
        origins=origins,
        directions=directions,
        rgb=torch.zeros(n, 3),
        alpha=None,
        image=torch.zeros(n, dtype=torch.int64),
        pixel=pixels,
        near=torch.full((n,), float(near)),
        far=torch.full((n,), float(far)),
        z_scale=z_scale,
        times=None if time is None else torch.full((n,), time),
    )
    return View(name, rays.to(device), camera.height, camera.width, stem=stem)


def _render(
    model: ExportedModel,
    views: Iterator[View],
    device: torch.device,
    out: Path | None,
    float_psnr: bool = False,
) -> dict[str, Any]:
    """Render ``views``; PNGs into ``out`` when given; per-image and mean metrics where targets exist
    (``float_psnr``: PSNR of the float render and target, as figures from before the protocol were)."""
    field, grid = models_from_state(model.config, model.state, device, str(model.path), ExportError)
    background = parse_background(model.config.background).to(device)
    scorer = Scorer(background, lpips=False)
    images = []
    for i, view in enumerate(views):
        pred = render_colours(model.config, field, grid, view.rays, background)
        pred = pred.view(view.height, view.width, 3).cpu()
        record: dict[str, Any] = {"name": view.name}
        if out is not None:
            record["file"] = f"{i:03d}_{view.stem or Path(view.name).stem}.png"
            save_render(out / record["file"], pred)
        if view.target is not None and view.stored is not None:
            record.update(scorer.figures(*scorer.prepare(pred, view.stored, view.mask)))
            if float_psnr:
                record["psnr"] = float(psnr(pred[None], view.target[None].cpu())[0])
        images.append(record)
    scored = [im for im in images if "psnr" in im]
    means = scorer.means(scored)
    figures = {k: means[k] for k in ("psnr", "ssim")}
    return {"n_images": len(images), **figures, "protocol": scorer.protocol_block(), "images": images}


def render_export(
    model_path: str | os.PathLike[str],
    cameras: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    split: str = "test",
    device: str | None = None,
) -> dict[str, Any]:
    """``raykit render --model``: render ``cameras`` (a store's ``split``, or a transforms.json) into ``out``.

    Returns the figures written to ``out/render.json``.
    """
    model = load_export(model_path)
    torch_device = resolve_device(device or model.config.device)
    source = Path(cameras)
    if source.suffix == ".json":
        views = transforms_views(model, source, torch_device)
    else:
        from raykit.store import open_store

        views = store_views(model, open_store(str(cameras)), split, torch_device)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"model": str(model_path), "cameras": str(cameras), "step": model.step}
    result.update(_render(model, views, torch_device, out_dir))
    atomic_write_json(out_dir / "render.json", result)
    return result


def verify_export(
    model_path: str | os.PathLike[str],
    *,
    split: str = "test",
    store: str | None = None,
    device: str | None = None,
    tolerance_db: float = 0.05,
) -> dict[str, Any]:
    """Re-render the run's evaluated images of ``split`` from the export; compare PSNR with the run's.

    Returns ``{"split", "n_images", "protocol", "psnr", "run_psnr", "difference_db", "tolerance_db"}``.
    Both PSNRs follow the protocol of the run's figures: the community protocol's 8-bit PSNR, or for
    figures recorded before it, the float PSNR. The 0.05 dB tolerance holds for either: the export and
    the run render the same images through the same path, so only float noise in rendering separates
    them, and one 8-bit step flipped in a pixel moves a PSNR by far less.
    """
    from raykit.store import open_store

    model = load_export(model_path)
    figures = (model.eval or {}).get(split)
    if figures is None:
        raise ExportError(
            f"{model_path}: the export holds no eval figures of split {split!r} to verify against"
        )
    ray_store = open_store(store or model.config.store)
    if ray_store.fingerprint != model.store_fingerprint:
        raise ExportError(
            f"{ray_store.url}: store fingerprint {ray_store.fingerprint} differs from the export's "
            f"{model.store_fingerprint}; pass the run's store with --store PATH"
        )
    torch_device = resolve_device(device or model.config.device)
    names = [image["name"] for image in figures["images"]]
    if not names:
        raise ExportError(f"{model_path}: the run evaluated no image of split {split!r}; nothing to verify")
    views = store_views(model, ray_store, split, torch_device, names)
    # figures of the float protocol (exports from before the community protocol) verify a float PSNR
    rendered = _render(model, views, torch_device, None, float_psnr=model.eval_protocol is None)
    difference = abs(rendered["psnr"] - figures["psnr"])
    result = {
        "split": split,
        "n_images": rendered["n_images"],
        "protocol": protocol_of({"protocol": model.eval_protocol}),
        "psnr": rendered["psnr"],
        "run_psnr": figures["psnr"],
        "difference_db": difference,
        "tolerance_db": tolerance_db,
    }
    if not difference <= tolerance_db:
        raise ExportError(
            f"{model_path}: verification failed: {split} PSNR from the export {rendered['psnr']:.3f} dB, "
            f"the run's eval {figures['psnr']:.3f} dB (difference {difference:.3f} dB > {tolerance_db} dB)"
        )
    return result
