"""What ``raykit evaluate PRED GT`` scores: image pairs found in folders, known render layouts and stores.

Layouts of PRED, recognised in this order: ``ns-render`` (nerfstudio's ``rgb/`` beside ``gt-rgb/``),
``gsplat`` (``simple_trainer``'s ``STAGE_stepSTEP_IIII.png`` canvases, ground truth on the left half,
the newest step scored) and ``folder`` (any folder of images, searched recursively). GT is a folder
of images or a store split ``STORE:SPLIT``. Images are matched by their path relative to the folder
without the extension, then without a leading ``NNN_`` (raykit's renders, :func:`render_stem` for a
store with times), then by the file stem alone when it names one ground-truth image; every image
must have exactly one partner (docs/evaluation.md). Every problem is a
:class:`~raykit.errors.SourceError` whose one line names the file. Every file is read once, bounded
(``raykit.fileio.read_bounded``), and its declared size is checked before it is decoded
(``raykit.imagedecode.check_pixels``).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raykit.errors import SourceError, StoreError
from raykit.fileio import IMAGE_FILE_LIMIT, UntrustedFileError, open_regular, read_bounded
from raykit.imagedecode import check_pixels, decode_image

if TYPE_CHECKING:
    from raykit.store import RayStore

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageRef",
    "Pair",
    "PairSet",
    "find_pairs",
    "load_pixels",
    "render_stem",
    "view_time",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".npy", ".exr")
_IGNORED_SUFFIXES = (".json", ".txt", ".md", ".csv", ".yaml", ".yml", ".log")
_GSPLAT = re.compile(r"^(?P<stage>[A-Za-z]+)_step(?P<step>\d+)_(?P<index>\d+)\.png$")
_INDEX_PREFIX = re.compile(r"^\d+_")


@dataclass(frozen=True)
class ImageRef:
    """One image: ``label`` names it in messages, ``loader`` returns its pixels (``(H, W, 3|4)`` uint8 or
    float), ``file`` is the file whose bytes are hashed (None: the pixels are hashed); ``mask`` returns the
    ground truth's ``(H, W)`` uint8 mask (0 = pixel not used; a store's ``mask`` component), or None;
    ``source`` is the file or folder the pixels come from (default ``file``): an output never replaces it."""

    label: str
    loader: Callable[[], np.ndarray]
    file: Path | None = None
    mask: Callable[[], np.ndarray] | None = None
    source: Path | None = None

    def load(self) -> np.ndarray:
        return load_pixels(self.label, self.loader)

    def sha256(self, pixels: np.ndarray) -> str:
        """sha256 of the file's bytes, or of ``shape`` and the pixels for an image inside another."""
        if self.file is not None:
            try:
                with open_regular(self.file, limit=IMAGE_FILE_LIMIT) as handle:
                    return hashlib.file_digest(handle, "sha256").hexdigest()
            except (OSError, ValueError) as exc:
                raise SourceError(f"{self.file}: not readable ({exc})") from None
        digest = hashlib.sha256(f"{pixels.dtype.str}{pixels.shape}".encode())
        digest.update(np.ascontiguousarray(pixels).tobytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class Pair:
    name: str
    pred: ImageRef
    gt: ImageRef


@dataclass(frozen=True)
class PairSet:
    """The matched pairs (sorted by name) and how the inputs were read (written to results.json)."""

    pairs: list[Pair]
    pred_layout: str
    gt_kind: str
    gt_split: str | None = None
    gsplat_step: int | None = None

    def inputs(self) -> list[Path]:
        """Every file (and store folder) the pairs are read from: what an output must not replace."""
        refs = [ref for pair in self.pairs for ref in (pair.pred, pair.gt)]
        return sorted({p for ref in refs if (p := ref.source or ref.file) is not None})


def load_pixels(label: str, loader: Callable[[], np.ndarray]) -> np.ndarray:
    """``loader()`` checked: ``(H, W, 3|4)``, uint8 or finite floats; otherwise one line naming ``label``."""
    try:
        pixels = loader()
    except SourceError:
        raise
    except UntrustedFileError as exc:  # not a regular file, or too large: the line names the file
        raise SourceError(str(exc)) from None
    except Exception as exc:  # Pillow, OpenCV and numpy raise many types for a file that is not an image
        raise SourceError(f"{label}: not a readable image ({type(exc).__name__}: {exc})") from None
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise SourceError(f"{label}: expected an RGB or RGBA image (H, W, 3|4), got shape {pixels.shape}")
    if pixels.dtype != np.uint8:
        if pixels.dtype.kind != "f":
            raise SourceError(f"{label}: expected uint8 or float pixels, got {pixels.dtype}")
        if not np.isfinite(pixels).all():
            raise SourceError(f"{label}: NaN or infinity in a float image")
    return pixels


def _read_file(path: Path) -> np.ndarray:
    data = read_bounded(path, limit=IMAGE_FILE_LIMIT)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        with io.BytesIO(data) as handle:
            fmt = np.lib.format
            header = (
                fmt.read_array_header_1_0 if fmt.read_magic(handle) == (1, 0) else fmt.read_array_header_2_0
            )
            shape = header(handle)[0]  # the header only
            if len(shape) >= 2:
                check_pixels(int(shape[1]), int(shape[0]))
            handle.seek(0)
            return np.load(handle, allow_pickle=False)
    if suffix == ".exr":
        return _read_exr(path, data)
    return decode_image(data)


def _exr_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of an OpenEXR file's ``dataWindow`` header attribute, or None."""
    if data[:4] != b"\x76\x2f\x31\x01":
        return None
    pos = 8
    while pos < min(len(data), 1 << 16) and data[pos]:
        name_end = data.find(b"\0", pos)
        type_end = data.find(b"\0", name_end + 1)
        if name_end < 0 or type_end < 0 or type_end + 4 > len(data):
            return None
        size = int.from_bytes(data[type_end + 1 : type_end + 5], "little")
        value = data[type_end + 5 : type_end + 5 + size]
        if data[pos:name_end] == b"dataWindow" and size == 16:
            x0, y0, x1, y1 = np.frombuffer(value, "<i4").tolist()
            return x1 - x0 + 1, y1 - y0 + 1
        pos = type_end + 5 + size
    return None


def _read_exr(path: Path, data: bytes) -> np.ndarray:
    os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")  # read at OpenCV's import
    import cv2

    size = _exr_size(data)
    if size is None:
        raise SourceError(f"{path}: not an OpenEXR file (no dataWindow in its header)")
    check_pixels(*size)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise SourceError(
            f"{path}: not a readable EXR image (OpenCV with OPENCV_IO_ENABLE_OPENEXR=1 reads them)"
        )
    if image.ndim == 3:
        image = image[..., [2, 1, 0, 3][: image.shape[2]]]
    return np.ascontiguousarray(image, dtype=np.float32)


def _file_ref(path: Path) -> ImageRef:
    return ImageRef(str(path), lambda: _read_file(path), path)


def _half(path: Path, right: bool) -> ImageRef:
    def load() -> np.ndarray:
        canvas = decode_image(read_bounded(path, limit=IMAGE_FILE_LIMIT))
        if canvas.shape[1] % 2:
            raise SourceError(
                f"{path}: a gsplat canvas has an even width (ground truth | render), got {canvas.shape[1]}"
            )
        width = canvas.shape[1] // 2
        return np.ascontiguousarray(canvas[:, width:] if right else canvas[:, :width])

    return ImageRef(f"{path} ({'right' if right else 'left'} half)", load, source=path)


def _image_files(folder: Path) -> dict[str, Path]:
    """Images under ``folder`` by relative path without extension; any other file is an error."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_dir() or any(part.startswith(".") for part in rel.parts):
            continue
        suffix = path.suffix.lower()
        if suffix in _IGNORED_SUFFIXES:
            continue
        if suffix not in IMAGE_SUFFIXES:
            raise SourceError(f"{path}: not an image (expected one of {', '.join(IMAGE_SUFFIXES)})")
        key = rel.with_suffix("").as_posix()
        if key in found:
            raise SourceError(f"{path}: two images named {key} ({found[key].name} too)")
        found[key] = path
    return found


def _ns_render_root(folder: Path) -> Path | None:
    if (folder / "rgb").is_dir() and (folder / "gt-rgb").is_dir():
        return folder
    splits = [
        p for p in sorted(folder.iterdir()) if p.is_dir() and (p / "rgb").is_dir() and (p / "gt-rgb").is_dir()
    ]
    if len(splits) > 1:
        raise SourceError(
            f"{folder}: ns-render output of several splits ({', '.join(p.name for p in splits)}): give one"
        )
    return splits[0] if splits else None


def _gsplat_canvases(folder: Path) -> tuple[int, dict[int, Path]] | None:
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    matches = [(m, p) for p in files if (m := _GSPLAT.match(p.name))]
    if not files or len(matches) != len(files):
        return None
    step = max(int(m["step"]) for m, _ in matches)
    return step, {int(m["index"]): p for m, p in matches if int(m["step"]) == step}


def _store_split(text: str) -> tuple[str, str] | None:
    """``STORE:SPLIT`` -> (store, split) when STORE is a raykit store; else None."""
    base, sep, split = text.rpartition(":")
    if not sep or not base or "/" in split or not split:
        return None
    if "://" not in base and not Path(base, "manifest.json").is_file():
        return None
    return base, split


def view_time(store: RayStore, name: str) -> tuple[str | None, float] | None:
    """Image ``name``'s rig camera and time in a store with times (None in a static store): the camera
    is ``camNN`` for a multi-view video's rig camera ``NN``, None without one (a D-NeRF capture's
    moving camera)."""
    table = store.table
    if table.time is None:
        return None
    index = store.image_index(name)
    rig = table.rig_camera
    return (None if rig is None else f"cam{int(rig[index]):02d}"), float(table.time[index])


def render_stem(store: RayStore, name: str) -> str:
    """The file stem of image ``name``'s render (after raykit's ``NNN_`` index prefix): the name's stem
    in a static store; in a store with times, camera and time (:func:`view_time`): ``cam03_t0.2500``,
    or without a rig camera the name's stem and time, ``r_000_t0.2500``."""
    when = view_time(store, name)
    if when is None:
        return Path(name).stem
    return f"{when[0] or Path(name).stem}_t{when[1]:.4f}"


def _gt_from_store(text: str, store_path: str, split: str) -> tuple[dict[str, ImageRef], dict[str, str]]:
    from raykit.store import open_store

    try:
        store = open_store(store_path)
    except StoreError as exc:
        raise SourceError(f"{store_path}: {exc}") from None
    if split not in store.splits:
        raise SourceError(
            f"{text}: the store has no split {split!r} (it has {', '.join(sorted(store.splits))})"
        )
    masked = "mask" in store.components
    refs = {
        Path(name).with_suffix("").as_posix(): ImageRef(
            f"{text}/{name}",
            functools.partial(store.read_image, name),
            mask=functools.partial(store.read_component, "mask", name) if masked else None,
            source=None if "://" in store_path else Path(store_path),
        )
        for name in store.images(split)
    }
    if store.table.time is None:
        return refs, {}
    return refs, {render_stem(store, n): Path(n).with_suffix("").as_posix() for n in store.images(split)}


def _ground_truth(gt: str) -> tuple[dict[str, ImageRef], str, str | None, dict[str, str]]:
    """Ground-truth images by key, their kind, the store's split, and aliases (render stem -> key)."""
    if (found := _store_split(gt)) is not None:
        refs, aliases = _gt_from_store(gt, *found)
        return refs, "store", found[1], aliases
    path = Path(gt)
    if Path(path, "manifest.json").is_file():
        raise SourceError(f"{gt}: a raykit store: name its split, e.g. {gt}:test")
    if not path.is_dir():
        raise SourceError(f"{gt}: no such folder of ground-truth images or STORE:SPLIT")
    return {key: _file_ref(p) for key, p in _image_files(path).items()}, "folder", None, {}


def _match(
    pred: dict[str, ImageRef],
    gt: dict[str, ImageRef],
    pred_root: str,
    gt_root: str,
    aliases: dict[str, str] | None = None,
) -> list[Pair]:
    """Pairs by key; failing that, a prediction matches by its key without raykit's ``NNN_`` render
    prefix, then by that as an alias of a key (a timed store's ``CAMERA_tTIME``), then by its file stem
    alone when exactly one ground-truth image has that stem."""
    aliases = aliases or {}
    by_stem: dict[str, list[str]] = {}
    for key in gt:
        by_stem.setdefault(key.rpartition("/")[2], []).append(key)
    by_key: dict[str, ImageRef] = {}
    for key, ref in pred.items():
        head, _, tail = key.rpartition("/")
        stripped = _INDEX_PREFIX.sub("", tail)
        exact = [c for c in (key, (head + "/" if head else "") + stripped, aliases.get(stripped)) if c in gt]
        stems = by_stem.get(tail) or by_stem.get(stripped) or []
        found = exact[0] if exact else stems[0] if len(stems) == 1 else None
        if found is None:
            raise SourceError(f"{ref.label}: a prediction with no ground-truth image {key} in {gt_root}")
        if found in by_key:
            raise SourceError(f"{ref.label}: a second prediction for the ground-truth image {found}")
        by_key[found] = ref
    missing = sorted(set(gt) - set(by_key))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise SourceError(f"{gt[missing[0]].label}: no prediction for this image in {pred_root}{more}")
    return [Pair(key, by_key[key], gt[key]) for key in sorted(gt)]


def find_pairs(pred: str, gt: str) -> PairSet:
    """The pairs to score (module docstring); one :class:`SourceError` line for the first problem."""
    pred_path = Path(pred)
    if not pred_path.is_dir():
        raise SourceError(f"{pred}: no such folder of predictions")
    same = Path(gt).resolve() == pred_path.resolve() if Path(gt).exists() else False
    if (root := _ns_render_root(pred_path)) is not None:
        preds = {k: _file_ref(p) for k, p in _image_files(root / "rgb").items()}
        if same:
            gts = {k: _file_ref(p) for k, p in _image_files(root / "gt-rgb").items()}
            return PairSet(
                _match(preds, gts, str(root / "rgb"), str(root / "gt-rgb")), "ns-render", "ns-render"
            )
        gts, kind, split, aliases = _ground_truth(gt)
        return PairSet(_match(preds, gts, str(root / "rgb"), gt, aliases), "ns-render", kind, split)
    if (canvases := _gsplat_canvases(pred_path)) is not None:
        step, files = canvases
        preds = {f"{i:04d}": _half(p, right=True) for i, p in sorted(files.items())}
        if same:
            gts = {f"{i:04d}": _half(p, right=False) for i, p in sorted(files.items())}
            return PairSet(_match(preds, gts, pred, pred), "gsplat", "gsplat", None, step)
        named, kind, split, _ = _ground_truth(gt)
        gts = {f"{i:04d}": ref for i, (_, ref) in enumerate(sorted(named.items()))}
        return PairSet(_match(preds, gts, pred, gt), "gsplat", kind, split, step)
    if same:
        raise SourceError(f"{pred}: GT is PRED itself, which only an ns-render or gsplat output can be")
    preds = {k: _file_ref(p) for k, p in _image_files(pred_path).items()}
    gts, kind, split, aliases = _ground_truth(gt)
    return PairSet(_match(preds, gts, pred, gt, aliases), "folder", kind, split)
