"""LPIPS built in raykit: torchvision-layout trunks and lpips heads load from files, the network equals
its reference twin and the lpips package (its values committed in tests/data/oracles for both nets, so
this runs everywhere; one test also runs the package where it imports), and a missing file is one clear
error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from raykit.metrics import LPIPS, LpipsWeightsError, load_lpips, lpips_weight_paths, reference_lpips

from ..data.oracles import cases


def _random_weights(tmp_path: Path, net: str, seed: int) -> tuple[Path, Path, dict, dict]:
    """Seeded torchvision-style trunk file (``features.*`` and a classifier that is ignored) and heads."""
    trunk, heads = cases.lpips_weights(net, seed)
    torch.save(trunk, tmp_path / f"{net}-trunk.pth")
    torch.save(heads, tmp_path / f"{net}-heads.pth")
    return tmp_path / f"{net}-trunk.pth", tmp_path / f"{net}-heads.pth", trunk, heads


def _images(seed: int, shape: tuple[int, ...] = cases.LPIPS_SHAPE) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = cases.lpips_images(seed, shape)
    return torch.from_numpy(a), torch.from_numpy(b)


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_equals_the_lpips_package(tmp_path: Path, net: str) -> None:
    """Against the lpips package's values (committed) on the same seeded weights and images."""
    oracle = cases.lpips_package(net)
    trunk_path, heads_path, _, _ = _random_weights(tmp_path, net, oracle["seed"])
    model = load_lpips(lpips_weight_paths(net, trunk_path, heads_path))
    with torch.no_grad():
        got = model(*_images(oracle["seed"])).double()
    expected = torch.tensor(oracle["values"], dtype=torch.float64)
    assert expected.min() > 0.05 and (expected[0] - expected[1]).abs() > 1e-3  # distinct, not degenerate
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_lpips_equals_reference_twin(tmp_path: Path, net: str) -> None:
    trunk_path, heads_path, trunk, heads = _random_weights(tmp_path, net, seed=len(net))
    model = load_lpips(lpips_weight_paths(net, trunk_path, heads_path))
    a, b = _images(1, cases.LPIPS_SHAPE if net == "alex" else (2, 16, 18, 3))  # VGG's float64 twin is slow
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


def test_missing_weights_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(LpipsWeightsError) as err:
        lpips_weight_paths("vgg", offline=True)
    message = str(err.value)
    assert "vgg16-397923af.pth" in message and "https://download.pytorch.org/models/" in message
    assert "\n" not in message and "offline" in message
    trunk_path, _, _, _ = _random_weights(tmp_path, "vgg", seed=6)
    with pytest.raises(LpipsWeightsError, match=r"nothere\.pth: LPIPS vgg heads not found"):
        lpips_weight_paths("vgg", trunk_path, tmp_path / "nothere.pth")
    with pytest.raises(LpipsWeightsError, match=r"nothere\.pth: LPIPS vgg trunk weights not found"):
        lpips_weight_paths(
            "vgg", tmp_path / "nothere.pth", tmp_path / "vgg-heads.pth"
        )  # given: never fetched
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
