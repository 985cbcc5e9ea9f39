"""LPIPS built in raykit: torchvision-layout trunks and lpips heads load from files, the network equals
its reference twin (and the lpips package where it imports), and a missing file is one clear error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from raykit.metrics import LPIPS, LpipsWeightsError, load_lpips, lpips_weight_paths, reference_lpips

SHAPE = (2, 36, 44, 3)


def _random_weights(tmp_path: Path, net: str, seed: int) -> tuple[Path, Path, dict, dict]:
    """A torchvision-style trunk file (``features.*`` and a classifier that is ignored) and lpips heads."""
    gen = torch.Generator().manual_seed(seed)
    model = LPIPS(net)
    trunk = {}
    for key, value in model.features.state_dict().items():
        trunk[f"features.{key}"] = torch.randn(value.shape, generator=gen) * (
            0.05 if value.dim() > 1 else 0.01
        )
    trunk["classifier.1.weight"] = torch.randn(10, 4, generator=gen)
    heads = {
        k: torch.rand(v.shape, generator=gen) for k, v in model.state_dict().items() if k.startswith("lin")
    }
    torch.save(trunk, tmp_path / f"{net}-trunk.pth")
    torch.save(heads, tmp_path / f"{net}-heads.pth")
    return tmp_path / f"{net}-trunk.pth", tmp_path / f"{net}-heads.pth", trunk, heads


def _images(seed: int, shape: tuple[int, ...] = SHAPE) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    b = (a.int() + torch.randint(-60, 60, shape, generator=gen)).clamp(0, 255).to(torch.uint8)
    return a, b


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_equals_reference_twin(tmp_path: Path, net: str) -> None:
    trunk_path, heads_path, trunk, heads = _random_weights(tmp_path, net, seed=len(net))
    model = load_lpips(lpips_weight_paths(net, trunk_path, heads_path))
    a, b = _images(1, SHAPE if net == "alex" else (2, 16, 18, 3))  # VGG's float64 twin is slow on CPUs
    with torch.no_grad():
        got = model(a, b).double()
    expected = reference_lpips(a, b, net, trunk, heads)
    assert got.shape == (2,) and (got > 0).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model(a[:1], b[:1]), model(a, b)[:1], rtol=0, atol=1e-6)
        assert model(a, a).abs().max() < 1e-6


def test_published_heads_located_without_importing_lpips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.find_spec("lpips")
    if spec is None:
        pytest.skip("the lpips wheel is not installed (pip install --no-deps lpips==0.1.4)")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    trunk_path, _, trunk, _ = _random_weights(tmp_path, "alex", seed=3)
    cached = tmp_path / "torch" / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth"
    cached.parent.mkdir(parents=True)
    trunk_path.rename(cached)
    paths = lpips_weight_paths("alex")
    assert paths.trunk == cached
    assert paths.heads.parts[-3:] == ("weights", "v0.1", "alex.pth") and "lpips" in paths.heads.parts
    heads = torch.load(paths.heads, map_location="cpu", weights_only=True)
    a, b = _images(2)
    with torch.no_grad():
        got = load_lpips(paths)(a, b).double()
    torch.testing.assert_close(got, reference_lpips(a, b, "alex", trunk, heads), rtol=0, atol=1e-5)


def test_equals_lpips_package_where_it_imports(tmp_path: Path) -> None:
    try:
        import lpips
    except Exception as exc:  # torchvision from the index does not import against the CPU torch here
        pytest.skip(f"the lpips package does not import here ({type(exc).__name__}: {exc})")
    trunk_path, heads_path, trunk, _ = _random_weights(tmp_path, "alex", seed=4)
    theirs = lpips.LPIPS(
        net="alex", pretrained=True, pnet_rand=True, model_path=str(heads_path), verbose=False
    )
    theirs.net.load_state_dict(
        {f"slice{s}.{k.split('.')[1]}.{k.split('.')[2]}": v for s, k, v in _slices(trunk)}
    )
    a, b = _images(5)
    ours = load_lpips(lpips_weight_paths("alex", trunk_path, heads_path))
    with torch.no_grad():
        expected = theirs(
            a.permute(0, 3, 1, 2).float() / 127.5 - 1, b.permute(0, 3, 1, 2).float() / 127.5 - 1
        )
        torch.testing.assert_close(ours(a, b), expected.flatten(), rtol=0, atol=1e-5)


def _slices(trunk: dict) -> list[tuple[int, str, torch.Tensor]]:
    """torchvision AlexNet keys -> the lpips package's slice numbers (slices end at 2, 5, 8, 10, 12)."""
    out = []
    for key, value in trunk.items():
        if key.startswith("features."):
            index = int(key.split(".")[1])
            out.append((1 + sum(index >= end for end in (2, 5, 8, 10)), key, value))
    return out


def test_missing_weights_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(LpipsWeightsError) as err:
        lpips_weight_paths("vgg")
    message = str(err.value)
    assert "vgg16-397923af.pth" in message and "https://download.pytorch.org/models/" in message
    assert "\n" not in message
    trunk_path, _, _, _ = _random_weights(tmp_path, "vgg", seed=6)
    with pytest.raises(LpipsWeightsError, match=r"nothere\.pth: LPIPS vgg heads not found"):
        lpips_weight_paths("vgg", trunk_path, tmp_path / "nothere.pth")
    (tmp_path / "bad.pth").write_bytes(b"not a state dict")
    with pytest.raises(LpipsWeightsError, match=r"bad\.pth: not a readable torch state dict"):
        load_lpips(lpips_weight_paths("vgg", trunk_path, tmp_path / "bad.pth"))


def test_weights_of_another_net_are_one_line(tmp_path: Path) -> None:
    trunk_path, _, _, _ = _random_weights(tmp_path, "alex", seed=7)
    vgg_heads = tmp_path / "vgg-heads.pth"
    torch.save(
        {k: torch.rand(v.shape) for k, v in LPIPS("vgg").state_dict().items() if k.startswith("lin")},
        vgg_heads,
    )
    with pytest.raises(LpipsWeightsError) as err:
        load_lpips(lpips_weight_paths("alex", trunk_path, vgg_heads))
    assert "weights do not fit LPIPS alex" in str(err.value) and "\n" not in str(err.value)
