"""DyNeRF's ISG/IST weights (raykit.temporal_weights) against a plain all-frames-at-once twin, and the
exact three-level draw (raykit.loaders.temporal) against the twin's distribution (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest

import raykit.loaders.temporal as temporal
import raykit.temporal_weights as tw
from raykit.errors import ConfigError, SourceError
from raykit.loaders.temporal import TemporalSampler, TemporalSamplingConfig, row_masses
from raykit.resample import downscale_area
from raykit.temporal_weights import TemporalWeightsConfig, temporal_weights

from .conftest import chi_square_p


def twin_weights(stack: np.ndarray, config: TemporalWeightsConfig) -> tuple[np.ndarray, np.ndarray]:
    """Plain numpy over all of one camera's frames at once: (T, H, W, 3) uint8 -> ISG, IST (T, h, w)."""
    stack = np.stack([downscale_area(frame, config.factor) for frame in stack])
    n = len(stack)
    median = np.sort(stack, axis=0)[(n - 1) // 2]  # the lower median
    d = (stack.astype(np.float64) - median) / 255.0
    isg = np.mean(d * d / (d * d + config.gamma**2), axis=-1)
    ist = np.zeros(stack.shape[:3])
    for t in range(n):
        for s in range(1, config.shift + 1):
            for u in (t - s, t + s):
                if 0 <= u < n:
                    ist[t] = np.maximum(ist[t], np.abs(stack[t].astype(np.int64) - stack[u]).max(-1) / 255.0)
    return isg.astype(np.float16), np.maximum(ist, config.alpha).astype(np.float16)


def moving_capture(cameras: int, frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """(C, T, H, W, 3) uint8: a noisy static background and a square that moves, per camera."""
    rng = np.random.default_rng(seed)
    out = np.empty((cameras, frames, height, width, 3), np.uint8)
    for c in range(cameras):
        background = rng.integers(40, 200, (height, width, 3))
        for t in range(frames):
            frame = background + rng.integers(-3, 4, (height, width, 3))
            y, x = (t + c) % max(1, height - 3), (2 * t) % max(1, width - 3)
            frame[y : y + 3, x : x + 3] = (250, 20 * c, 10 * t % 256)
            out[c, t] = np.clip(frame, 0, 255)
    return out


CASES = [(11, 1, 3, None), (9, 2, 25, 1), (1, 1, 2, None)]  # frames, level, shift, band rows


@pytest.mark.parametrize(("frames", "factor", "shift", "band"), CASES)
def test_weights_equal_the_twin(monkeypatch: pytest.MonkeyPatch, frames: int, factor: int, shift: int,
                                band: int | None) -> None:  # fmt: skip
    if band is not None:  # one row per band: the bands' seams are checked too
        monkeypatch.setattr(tw, "BAND_BYTES", 1)
    stack = moving_capture(1, frames, 13, 10, seed=frames)[0]
    config = TemporalWeightsConfig(shift=shift, factor=factor)
    got = temporal_weights((frame for frame in stack), config)  # a generator: read once
    isg, ist = twin_weights(stack, config)
    assert got.isg.shape == got.ist.shape == isg.shape == (frames, 13 // factor, 10 // factor)
    assert got.isg.dtype == got.ist.dtype == np.float16
    np.testing.assert_array_equal(got.ist, ist)  # integer differences: exact
    ulp = np.spacing(np.abs(isg.astype(np.float32)).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(got.isg.astype(np.float32) - isg.astype(np.float32)) <= ulp)
    assert (ist >= np.float16(config.alpha)).all() and (ist > np.float16(config.alpha)).any() == (frames > 1)
    assert isg.max() > 0.5 or frames == 1  # the moving square stands out from the median


def test_bad_frames_and_options_are_one_line() -> None:
    good = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(SourceError, match=r"frame 1: expected \(H, W, 3\) uint8"):
        temporal_weights([good, good.astype(np.float32)])
    with pytest.raises(SourceError, match="frame 1: expected"):
        temporal_weights([good, np.zeros((5, 4, 3), np.uint8)])
    with pytest.raises(SourceError, match="at least one frame"):
        temporal_weights([])
    with pytest.raises(SourceError, match="under the level 8"):
        temporal_weights([good], TemporalWeightsConfig(factor=8))
    with pytest.raises(ConfigError, match="shift: expected an integer"):
        TemporalWeightsConfig(shift=0)
    with pytest.raises(ConfigError, match="ist_step"):
        TemporalSamplingConfig(ist_step=-1)


def _sampler(capture: np.ndarray, config: TemporalWeightsConfig, factor: int, ist_step: int,
             flat_bytes: int = 0) -> tuple[TemporalSampler, dict[str, np.ndarray]]:  # fmt: skip
    """The sampler over every frame of every camera (camera-major), and the twin's (F, h, w) distributions
    (``flat_bytes``: the whole CDF held, ``draw_by_frame`` by guided searches in it)."""
    ours = [temporal_weights(iter(frames), config) for frames in capture]
    stored = {"isg": np.concatenate([o.isg for o in ours]), "ist": np.concatenate([o.ist for o in ours])}
    twins = [twin_weights(frames, config) for frames in capture]
    target = {kind: np.concatenate([t[i] for t in twins]).astype(np.float64) for i, kind in enumerate(stored)}
    rows = {kind: row_masses(weights) for kind, weights in stored.items()}
    schedule = TemporalSamplingConfig(ist_step=ist_step)
    sampler = TemporalSampler(rows, lambda kind, f, y: stored[kind][f, y], stored["isg"].shape[2], factor,
                              schedule, seed=7, flat_bytes=flat_bytes)  # fmt: skip
    return sampler, {kind: p / p.sum() for kind, p in target.items()}


@pytest.mark.parametrize(
    ("method", "flat_bytes"), [("draw", 0), ("draw_by_frame", 0), ("draw_by_frame", 2**20)]
)
def test_draws_match_the_twins_distribution_and_not_a_wrong_one(method: str, flat_bytes: int) -> None:
    capture = moving_capture(2, 8, 6, 5, seed=3)  # 16 frames x 30 pixels = 480 cells
    config = TemporalWeightsConfig(shift=2, factor=1)
    sampler, target = _sampler(capture, config, factor=1, ist_step=2, flat_bytes=flat_bytes)
    n, shape = 100_000, target["isg"].shape
    for step, kind in ((0, "isg"), (1, "isg"), (2, "ist"), (9, "ist")):
        draw = getattr(sampler, method)(step, n)
        assert draw.kind == kind
        if method == "draw_by_frame":  # sorted by frame, each ray's place a permutation of the batch's
            assert (np.diff(draw.frame) >= 0).all() and draw.order is not None
            assert np.array_equal(np.sort(draw.order), np.arange(n))
        cell = np.ravel_multi_index((draw.frame, draw.y, draw.x), shape)
        observed = np.bincount(cell, minlength=target[kind].size).astype(np.float64)
        p = target[kind].reshape(-1)
        assert chi_square_p(observed, n * p) > 1e-4
        assert observed[p == 0].sum() == 0
        np.testing.assert_allclose(draw.prob, p[cell], rtol=2e-3)  # the twin's within float16
        uniform = np.full(p.size, n / p.size)
        assert chi_square_p(observed, uniform) < 1e-12  # the test has the power to reject a wrong law
    if flat_bytes:  # the draws are the batch's, in any order: the same for the same seed and step
        again = _sampler(capture, config, factor=1, ist_step=2, flat_bytes=flat_bytes)[0].draw_by_frame(9, n)
        assert all(
            np.array_equal(u, v) for u, v in zip(draw[:4] + draw[5:], again[:4] + again[5:], strict=True)
        )
    other = TemporalWeightsConfig(shift=2, factor=1, gamma=0.2)  # a near miss: another gamma's ISG
    draw = getattr(sampler, method)(0, n)
    near = _sampler(capture, other, 1, 10)[1]["isg"].reshape(-1)
    cell = np.ravel_multi_index((draw.frame, draw.y, draw.x), shape)
    assert chi_square_p(np.bincount(cell, minlength=near.size).astype(np.float64), n * near) < 1e-12


def test_draws_are_seeded_and_blocks_are_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    capture, ist = moving_capture(1, 6, 8, 8, seed=5), TemporalSamplingConfig(ist_step=0)
    sampler, target = _sampler(capture, TemporalWeightsConfig(shift=2, factor=2), factor=2, ist_step=0)
    a = sampler.draw(3, 20_000)
    monkeypatch.setattr(temporal, "ROWS_BYTES", 8 * 4 * 7)  # rows gathered 7 at a time: the same draws
    b = sampler.draw(3, 20_000)
    assert all(np.array_equal(u, v) for u, v in zip(a[:4], b[:4], strict=True))
    assert not np.array_equal(a.frame, sampler.draw(4, 20_000).frame)
    c = sampler.draw_by_frame(3, 20_000)  # the same law, sorted by frame, each frame read once
    assert (np.diff(c.frame) >= 0).all() and c.y.max() < 8 and c.x.max() < 8
    cell_c = np.ravel_multi_index((c.frame, c.y // 2, c.x // 2), target["ist"].shape)
    np.testing.assert_allclose(c.prob, target["ist"].reshape(-1)[cell_c] / 4, rtol=2e-3)
    assert a.y.max() < 8 and a.x.max() < 8 and a.y.min() >= 0
    cell = np.ravel_multi_index((a.frame, a.y // 2, a.x // 2), target["ist"].shape)
    np.testing.assert_allclose(a.prob, target["ist"].reshape(-1)[cell] / 4, rtol=2e-3)
    within = (a.y % 2) * 2 + a.x % 2  # the pixel within its 2x2 block: uniform
    counts = np.bincount(within, minlength=4).astype(np.float64)
    assert chi_square_p(counts, np.full(4, len(within) / 4)) > 1e-4
    with pytest.raises(ConfigError, match="positive number of rays"):
        sampler.draw(0, 0)
    with pytest.raises(ConfigError, match="batch 0 draws by ISG, not given"):
        TemporalSampler({"ist": np.ones((2, 3))}, lambda kind, f, y: np.ones((len(f), 4)), 4).draw(0, 5)
    with pytest.raises(SourceError, match=r"expected IST rows of shape \(5, 4\), got \(5, 3\)"):
        TemporalSampler(
            {"ist": np.ones((2, 3))}, lambda kind, f, y: np.ones((len(f), 3)), 4, config=ist
        ).draw(0, 5)
    with pytest.raises(SourceError, match="the ISG weights are all zero"):
        TemporalSampler({"isg": np.zeros((2, 3))}, lambda kind, f, y: np.ones((len(f), 4)), 4)


def test_guided_search_is_searchsorted() -> None:
    rng = np.random.default_rng(11)
    weights = rng.random(3000) ** 8  # many tiny weights in one span, and runs of zeros, of every length
    weights[rng.random(3000) < 0.3] = 0
    weights[:40] = weights[1000:1700] = weights[-50:] = 0
    cdf = np.concatenate([[0.0], np.cumsum(weights.astype(np.float16).astype(np.float64))])
    targets = np.concatenate([rng.random(20_000) * cdf[-1], cdf, [0.0, cdf[-1]], np.nextafter(cdf, 0)])
    for buckets in (1, 7, len(cdf), 4 * len(cdf)):  # one span holds everything .. most spans empty
        found = temporal.GuidedSearch(cdf, buckets)(targets)
        assert np.array_equal(found, np.searchsorted(cdf, targets, side="right"))
