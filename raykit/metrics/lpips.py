"""LPIPS (Zhang et al. 2018, version 0.1) with the AlexNet and VGG16 trunks, built here, no torchvision.

The trunks are laid out as torchvision lays out ``alexnet().features`` and ``vgg16().features`` (module
indices included), so torchvision's published state dicts load into them (``features.N.weight``; the
classifier's keys are ignored). The linear heads are the ``lpips`` package's ``lin0..lin4`` 1x1
convolutions (keys ``linK.model.1.weight``). :func:`lpips_weight_paths` finds the trunk in torch hub's
cache (``$TORCH_HOME/hub/checkpoints``), fetching it once from :data:`TRUNK_URLS` when it is absent (the
file checked against the sha256 prefix its torchvision name carries, as
``torch.hub.load_state_dict_from_url(..., check_hash=True)`` checks it), and the heads in the installed
``lpips`` wheel's data files (located without importing it), or takes the paths given. Offline
(``offline=True`` or ``RAYKIT_OFFLINE=1``) nothing is fetched; a missing or refused file is one
:class:`LpipsWeightsError` line naming it and how to get it.

Inputs are ``(B, H, W, 3)`` protocol images (uint8, or floats in [0, 1]); each is mapped to ``2 x - 1``
as nerfbaselines does. :func:`reference_lpips` is the twin: the same weights applied layer by layer with
``torch.nn.functional`` from the state dicts, sharing no code with :class:`LPIPS`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raykit.errors import ConfigError, RaykitError
from raykit.fileio import atomic_path


class LpipsWeightsError(RaykitError, FileNotFoundError):
    """A weight file LPIPS needs is not on this machine and could not be fetched (or is not one)."""


# Per net: torchvision's feature layers ("C" conv out-channels kernel stride padding, "R" ReLU, "M" max
# pool 3/2 for AlexNet, 2/2 for VGG), the module index after which each LPIPS tap is taken, the trunk's
# published file (torchvision's name: the first digits of its sha256 after the last "-").
_ALEX = [("C", 64, 11, 4, 2), ("R",), ("M",), ("C", 192, 5, 1, 2), ("R",), ("M",),
         ("C", 384, 3, 1, 1), ("R",), ("C", 256, 3, 1, 1), ("R",), ("C", 256, 3, 1, 1), ("R",)]  # fmt: skip
_VGG = [("C", 64, 3, 1, 1), ("R",), ("C", 64, 3, 1, 1), ("R",), ("M",),
        ("C", 128, 3, 1, 1), ("R",), ("C", 128, 3, 1, 1), ("R",), ("M",),
        ("C", 256, 3, 1, 1), ("R",), ("C", 256, 3, 1, 1), ("R",), ("C", 256, 3, 1, 1), ("R",), ("M",),
        ("C", 512, 3, 1, 1), ("R",), ("C", 512, 3, 1, 1), ("R",), ("C", 512, 3, 1, 1), ("R",), ("M",),
        ("C", 512, 3, 1, 1), ("R",), ("C", 512, 3, 1, 1), ("R",), ("C", 512, 3, 1, 1), ("R",)]  # fmt: skip


@dataclass(frozen=True)
class _Net:
    layers: list[tuple[Any, ...]]
    taps: tuple[int, ...]
    pool: int


_NETS = {"alex": _Net(_ALEX, (1, 4, 7, 9, 11), 3), "vgg": _Net(_VGG, (3, 8, 15, 22, 29), 2)}
LPIPS_NETS = tuple(_NETS)
# Where each trunk is fetched from (the tests point these at a server on loopback); the file keeps its name
# in torch hub's cache, and the hex digits after its last "-" are the prefix its sha256 must have.
TRUNK_URLS = {
    "alex": "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
    "vgg": "https://download.pytorch.org/models/vgg16-397923af.pth",
}
OFFLINE_ENV = "RAYKIT_OFFLINE"  # set to 1: nothing is fetched (as offline=True / --offline)
_HASH = re.compile(r"-([a-f0-9]+)\.")  # torch.hub's HASH_REGEX
_TIMEOUT_S = 60.0  # a stalled server is an error, never a hang
# The smallest image side each trunk takes (AlexNet: 11/4 convolution and two 3/2 pools; VGG: four 2/2 pools).
MIN_SIDE = {"alex": 31, "vgg": 16}
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)


@dataclass(frozen=True)
class LpipsWeights:
    """Where one net's weights are: the torchvision trunk and the lpips heads."""

    net: str
    trunk: Path
    heads: Path


def _lpips_data_dir() -> Path | None:
    """The installed ``lpips`` package's folder, found without importing it (it imports torchvision)."""
    spec = importlib.util.find_spec("lpips")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _offline(offline: bool | None) -> bool:
    return offline if offline is not None else os.environ.get(OFFLINE_ENV, "") not in ("", "0")


def _fetch(net: str, url: str, path: Path) -> None:
    """Download ``url`` to ``path`` (atomically), checked against the sha256 prefix in its name."""
    found = _HASH.search(path.name)
    prefix = found.group(1) if found else ""
    digest = hashlib.sha256()
    try:
        with atomic_path(path) as tmp, urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            if sys.stderr.isatty():
                print(f"raykit: fetching LPIPS {net} trunk weights {url} -> {path}", file=sys.stderr)
            with open(tmp, "wb") as out:
                while block := response.read(1 << 20):
                    digest.update(block)
                    out.write(block)
            if not digest.hexdigest().startswith(prefix):
                raise ValueError(digest.hexdigest())  # nothing is kept: atomic_path removes the file
    except ValueError as exc:
        raise LpipsWeightsError(
            f"{url}: refused: its sha256 {exc} does not begin with {prefix}, the digits its name carries; "
            f"nothing was kept at {path}"
        ) from None
    except OSError as exc:  # no network, refused, timed out, HTTP errors (urllib's are OSErrors)
        reason = getattr(exc, "reason", None) or exc
        raise LpipsWeightsError(
            f"{url}: could not fetch LPIPS {net} trunk weights ({reason}); download it to {path} (or give "
            f"its path with --lpips-{net}-trunk, or pass --no-lpips)"
        ) from None


def lpips_weight_paths(
    net: str, trunk: str | Path | None = None, heads: str | Path | None = None, offline: bool | None = None
) -> LpipsWeights:
    """The weight files of ``net`` (``alex`` or ``vgg``), checked to exist.

    ``trunk`` defaults to torch hub's cache (``$TORCH_HOME/hub/checkpoints/<torchvision file>``),
    fetched once from :data:`TRUNK_URLS` when absent unless ``offline`` (default: the
    ``RAYKIT_OFFLINE`` environment variable); ``heads`` to ``<lpips package>/weights/v0.1/<net>.pth``.
    Raises :class:`LpipsWeightsError` naming the missing (or refused) file and how to get it.
    """
    if net not in _NETS:
        raise ConfigError(f"unknown LPIPS net {net!r}: expected one of {', '.join(LPIPS_NETS)}")
    url = TRUNK_URLS[net]
    trunk_path = (
        Path(trunk) if trunk is not None else Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/")[-1]
    )
    if not trunk_path.is_file():
        if trunk is None and not _offline(offline):
            _fetch(net, url, trunk_path)
        else:
            why = "" if trunk is not None else f"; offline (--offline or {OFFLINE_ENV}=1), nothing is fetched"
            raise LpipsWeightsError(
                f"{trunk_path}: LPIPS {net} trunk weights not found; download {url} to that path "
                f"(or give its path with --lpips-{net}-trunk, or pass --no-lpips){why}"
            )
    if heads is None:
        package = _lpips_data_dir()
        if package is None:
            raise LpipsWeightsError(
                f"lpips/weights/v0.1/{net}.pth: LPIPS {net} heads not found (the lpips package is not "
                f"installed); run `pip install --no-deps lpips==0.1.4` or give the file with "
                f"--lpips-{net}-heads"
            )
        heads = package / "weights" / "v0.1" / f"{net}.pth"
    heads_path = Path(heads)
    if not heads_path.is_file():
        raise LpipsWeightsError(
            f"{heads_path}: LPIPS {net} heads not found; run `pip install --no-deps lpips==0.1.4` (its wheel "
            f"carries weights/v0.1/{net}.pth) or give the file with --lpips-{net}-heads"
        )
    return LpipsWeights(net, trunk_path, heads_path)


def _build_features(layers: list[tuple[Any, ...]], pool: int) -> nn.Sequential:
    modules: list[nn.Module] = []
    channels = 3
    for layer in layers:
        if layer[0] == "C":
            _, out, kernel, stride, padding = layer
            modules.append(nn.Conv2d(channels, out, kernel, stride, padding))
            channels = out
        elif layer[0] == "R":
            modules.append(nn.ReLU(inplace=True))
        else:
            modules.append(nn.MaxPool2d(pool, 2))
    return nn.Sequential(*modules)


def _head_channels(layers: list[tuple[Any, ...]], taps: tuple[int, ...]) -> list[int]:
    channels, out = 3, []
    for i, layer in enumerate(layers):
        channels = layer[1] if layer[0] == "C" else channels
        if i in taps:
            out.append(channels)
    return out


class _Head(nn.Module):
    """The lpips package's ``NetLinLayer``: dropout (identity in evaluation) and a 1x1 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Dropout(), nn.Conv2d(channels, 1, 1, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class LPIPS(nn.Module):
    """LPIPS v0.1 over one trunk; ``forward(pred, target) -> (B,)`` (see the module docstring).

    ``features`` has torchvision's layout, ``lin0..lin4`` the lpips package's; load weights with
    :func:`load_lpips` (or ``features.load_state_dict`` / ``load_state_dict`` of the heads yourself).
    """

    shift: Tensor
    scale: Tensor

    def __init__(self, net: str = "alex") -> None:
        super().__init__()
        if net not in _NETS:
            raise ConfigError(f"unknown LPIPS net {net!r}: expected one of {', '.join(LPIPS_NETS)}")
        spec = _NETS[net]
        self.net = net
        self.taps = spec.taps
        self.features = _build_features(spec.layers, spec.pool)
        for i, channels in enumerate(_head_channels(spec.layers, spec.taps)):
            self.add_module(f"lin{i}", _Head(channels))
        self.register_buffer("shift", torch.tensor(_SHIFT).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor(_SCALE).view(1, 3, 1, 1))
        self.requires_grad_(False)
        self.eval()

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        x = torch.cat([_signed(pred), _signed(target)]).to(self.shift.device)
        h = (x - self.shift) / self.scale
        total = torch.zeros(pred.shape[0], device=h.device)
        tap = 0
        for i, layer in enumerate(self.features):
            if i > self.taps[-1]:
                break
            h = layer(h)
            if i in self.taps:
                unit = h / (torch.sqrt((h * h).sum(1, keepdim=True)) + 1e-10)
                a, b = unit.chunk(2)
                total = total + getattr(self, f"lin{tap}")((a - b) ** 2).mean((1, 2, 3))
                tap += 1
        return total


def _signed(images: Tensor) -> Tensor:
    """``(B, H, W, 3)`` protocol images -> ``(B, 3, H, W)`` float32 in [-1, 1]."""
    x = (
        images.to(torch.float32) / 255.0
        if images.dtype == torch.uint8
        else images.to(torch.float32).clamp(0, 1)
    )
    return x.permute(0, 3, 1, 2) * 2 - 1


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (torch's load errors run over many)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: one line naming it
        raise LpipsWeightsError(
            f"{path}: not a readable torch state dict ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    if not isinstance(state, dict):
        raise LpipsWeightsError(f"{path}: expected a state dict, got {type(state).__name__}")
    return state


def load_lpips(weights: LpipsWeights, device: str | torch.device = "cpu") -> LPIPS:
    """An :class:`LPIPS` with the published weights of ``weights`` (torchvision trunk, lpips heads)."""
    model = LPIPS(weights.net)
    trunk = {k[len("features.") :]: v for k, v in _load(weights.trunk).items() if k.startswith("features.")}
    heads = _load(weights.heads)
    try:
        model.features.load_state_dict(trunk)
        model.load_state_dict({**heads, **{f"features.{k}": v for k, v in trunk.items()}}, strict=False)
        missing = [k for k in model.state_dict() if k.startswith("lin") and k not in heads]
    except RuntimeError as exc:
        raise LpipsWeightsError(
            f"{weights.trunk}, {weights.heads}: weights do not fit LPIPS {weights.net}: {_first_line(exc)}"
        ) from None
    if missing:
        raise LpipsWeightsError(f"{weights.heads}: LPIPS {weights.net} heads lack {', '.join(missing)}")
    return model.to(device)


def reference_lpips(
    pred: Tensor, target: Tensor, net: str, trunk: dict[str, Tensor], heads: dict[str, Tensor]
) -> Tensor:
    """Slow twin of :class:`LPIPS`: one image at a time, the layers spelled out with ``F`` from the state
    dicts (``trunk`` in torchvision's keys, ``heads`` in lpips' keys); float64."""
    convs = {"alex": [(4, 2), (1, 2), (1, 1), (1, 1), (1, 1)], "vgg": [(1, 1)] * 13}[net]
    pools_after = {"alex": {0, 1}, "vgg": {1, 3, 6, 9}}[net]
    taps_after = {"alex": {0, 1, 2, 3, 4}, "vgg": {1, 3, 6, 9, 12}}[net]
    pool = {"alex": 3, "vgg": 2}[net]
    weights = sorted(
        {int(k.split(".")[1]) for k in trunk if k.startswith("features.") and k.endswith("weight")}
    )
    shift = torch.tensor(_SHIFT, dtype=torch.float64).view(3, 1, 1)
    scale = torch.tensor(_SCALE, dtype=torch.float64).view(3, 1, 1)
    out = []
    for a, b in zip(pred, target, strict=True):
        feats = []
        for image in (a, b):
            x = image.to(torch.float64) / 255.0 if image.dtype == torch.uint8 else image.to(torch.float64)
            h = ((x.permute(2, 0, 1) * 2 - 1 - shift) / scale)[None]
            taps = []
            for n, (index, (stride, padding)) in enumerate(zip(weights, convs, strict=True)):
                w = trunk[f"features.{index}.weight"].double()
                h = F.relu(F.conv2d(h, w, trunk[f"features.{index}.bias"].double(), stride, padding))
                if n in taps_after:
                    taps.append(h / (h.pow(2).sum(1, keepdim=True).sqrt() + 1e-10))
                if n in pools_after:
                    h = F.max_pool2d(h, pool, 2)
            feats.append(taps)
        value = sum(
            F.conv2d((fa - fb) ** 2, heads[f"lin{k}.model.1.weight"].double()).mean()
            for k, (fa, fb) in enumerate(zip(*feats, strict=True))
        )
        out.append(float(value))
    return torch.tensor(out, dtype=torch.float64)
