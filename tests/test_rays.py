"""RayGenerator against its reference twin, pixel-id decoding, and RayBatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raykit import pixel_layout, ray_batch
from raykit import rays as rays_module
from raykit.cameras import Camera
from raykit.errors import CameraError
from raykit.rays import RayBatch, RayGenerator, Rays, reference_rays, unit_colours

PINHOLES = [
    Camera("PINHOLE", 24, 16, (20.0, 21.0, 12.5, 7.5)),
    Camera("SIMPLE_PINHOLE", 9, 13, (11.0, 4.0, 6.0)),
]
DISTORTED = [
    Camera("OPENCV", 24, 16, (20.0, 21.0, 12.5, 7.5, 0.05, -0.01, 0.001, -0.002)),
    Camera("OPENCV_FISHEYE", 17, 11, (9.0, 9.5, 8.0, 5.0, 0.02, -0.005, 0.001, 0.0)),
]
OTHERS = [
    Camera("OPENCV", 24, 16, (22.0, 21.0, 12.0, 8.5, -0.03, 0.01, -0.001, 0.002)),
    Camera("FOV", 15, 12, (14.0, 13.0, 7.0, 6.5, 0.8)),
    Camera("FOV", 15, 12, (14.0, 13.0, 7.0, 6.5, 0.005)),
    Camera("EUCM", 20, 14, (15.0, 15.0, 10.0, 7.0, 0.6, 1.1)),
    Camera("DIVISION", 20, 14, (15.0, 16.0, 10.0, 7.0, -0.1)),
]


def random_poses(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c2w = np.tile(np.eye(4), (n, 1, 1))
    for i in range(n):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        c2w[i, :3, :3] = q * np.sign(np.linalg.det(q))
        c2w[i, :3, 3] = rng.normal(size=3)
    return c2w


def twin(gen: RayGenerator, image: torch.Tensor, pixel: torch.Tensor) -> Rays:
    """The reference twin on the generator's own inputs (public attributes, not its tables)."""
    return reference_rays(
        gen.cameras,
        gen.camera_index,
        gen.c2w,
        gen.near,
        gen.far,
        image,
        pixel,
        device=gen.device,
        dtype=gen.dtype,
    )


def make_generator(
    cameras: list[Camera], n_images: int = 7, dtype: torch.dtype = torch.float32, device: str = "cpu", **kw
) -> RayGenerator:
    rng = np.random.default_rng(1)
    camera_index = rng.permutation(np.arange(n_images) % len(cameras))
    near = rng.uniform(0.1, 1.0, n_images)
    return RayGenerator(
        cameras, camera_index, random_poses(n_images, 2), near, near + 4.0, device, dtype, **kw
    )


def random_rays(gen: RayGenerator, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, gen.n_images, n)
    x = (rng.random(n) * gen.widths[image]).astype(np.int64)
    y = (rng.random(n) * gen.heights[image]).astype(np.int64)
    return torch.from_numpy(image), torch.from_numpy(np.stack([x, y], -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("cameras", "mode"),
    [
        (PINHOLES, "pinhole"),
        (DISTORTED[:1], "lut"),
        (DISTORTED, "lut"),
        (PINHOLES + DISTORTED + OTHERS, "lut"),
        (PINHOLES + DISTORTED + OTHERS, "unproject"),
    ],
    ids=["pinhole", "lut-one-camera", "lut", "mixed", "unproject"],
)
def test_generate_matches_reference(cameras: list[Camera], mode: str, dtype: torch.dtype) -> None:
    budget = 0 if mode == "unproject" else 2**30
    gen = make_generator(cameras, n_images=12, dtype=dtype, lut_max_bytes=budget)
    assert gen.mode == mode and gen.uses_lut == (mode == "lut")
    image, pixel = random_rays(gen, 500, 3)
    fast, ref = gen.generate(image, pixel), twin(gen, image, pixel)
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    for name, a, b in zip(fast._fields, fast, ref, strict=True):
        assert a.dtype == dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=name)
    norms = torch.linalg.vector_norm(fast.directions, dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=atol * 2, rtol=0)


def test_pixel_ids_decode_row_major() -> None:
    gen = make_generator(PINHOLES + DISTORTED, n_images=5)
    counts = gen.widths * gen.heights
    assert gen.pixel_offset.tolist() == [0, *np.cumsum(counts).tolist()]
    pid = torch.arange(int(gen.pixel_offset[-1]))
    image, pixel = gen.decode_pids(pid.to(torch.int32))
    expected_image = torch.repeat_interleave(torch.arange(5), torch.from_numpy(counts))
    assert torch.equal(image, expected_image)
    local = pid - torch.from_numpy(gen.pixel_offset)[image]
    w = torch.from_numpy(gen.widths)[image]
    assert torch.equal(pixel[:, 1] * w + pixel[:, 0], local)
    assert bool((pixel[:, 0] < w).all())


@pytest.mark.parametrize("cameras", [PINHOLES[:1], DISTORTED[:1], [PINHOLES[0], DISTORTED[0]]])
def test_uniform_layout_pids_round_trip(cameras: list[Camera]) -> None:
    # Images of one size, ids packed without gaps: decoded by division, no table lookups.
    gen = make_generator(cameras, n_images=6)
    assert gen.pid_decoding == "uniform"
    image, pixel = random_rays(gen, 400, 7)
    pid = torch.from_numpy(gen.pixel_offset)[image] + pixel[:, 1] * int(gen.widths[0]) + pixel[:, 0]
    got_image, got_pixel, rays = gen.generate_from_pids(pid.to(torch.int32))
    assert torch.equal(got_image, image) and torch.equal(got_pixel, pixel)
    for a, b in zip(rays, twin(gen, image, pixel), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("max_blocks", [1 << 22, 1], ids=["block-table", "binary-search"])
def test_generate_from_pids(max_blocks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pixel_layout, "_MAX_BLOCKS", max_blocks)
    # Image sizes of 1 pixel and gaps between images stress the decoder.
    cameras = [*DISTORTED, Camera("PINHOLE", 1, 1, (1.0, 1.0, 0.5, 0.5))]
    gen = RayGenerator(
        cameras, [2, 0, 1, 2, 0], random_poses(5, 4), 0.5, 3.0, pixel_offset=[0, 5, 400, 600, 601]
    )
    assert gen.pid_decoding == ("search" if max_blocks == 1 else "blocks")
    image, pixel = random_rays(gen, 300, 5)
    pid = (
        torch.from_numpy(gen.pixel_offset)[image]
        + pixel[:, 1] * torch.from_numpy(gen.widths)[image]
        + pixel[:, 0]
    )
    got_image, got_pixel, rays = gen.generate_from_pids(pid, check=True)
    assert torch.equal(got_image, image) and torch.equal(got_pixel, pixel)
    torch.testing.assert_close(rays.directions, gen.generate(image, pixel).directions)


def test_checks_raise_camera_errors() -> None:
    gen = make_generator(DISTORTED, n_images=3)
    with pytest.raises(CameraError, match="image index"):
        gen.generate(torch.tensor([3]), torch.tensor([[0, 0]]), check=True)
    with pytest.raises(CameraError, match="pixel outside"):
        gen.generate(torch.tensor([0]), torch.tensor([[int(gen.widths[0]), 0]]), check=True)
    with pytest.raises(CameraError, match="pixel id"):
        gen.generate_from_pids(torch.tensor([int(gen.pixel_offset[-1])]), check=True)
    with pytest.raises(CameraError, match="c2w"):
        RayGenerator(DISTORTED, [0, 1], np.eye(4)[None], 1.0, 2.0)
    with pytest.raises(CameraError, match="camera_index"):
        RayGenerator(DISTORTED, [0, 2], random_poses(2, 0), 1.0, 2.0)
    with pytest.raises(CameraError, match="pixel_offset"):
        RayGenerator(DISTORTED, [0, 1], random_poses(2, 0), 1.0, 2.0, pixel_offset=[0, 10])


def make_batch(n: int, alpha: bool) -> RayBatch:
    g = torch.Generator().manual_seed(0)
    return RayBatch(
        origins=torch.rand(n, 3, generator=g),
        directions=torch.nn.functional.normalize(torch.rand(n, 3, generator=g), dim=-1),
        rgb=torch.rand(n, 3, generator=g),
        alpha=torch.rand(n, generator=g) if alpha else None,
        image=torch.arange(n),
        pixel=torch.zeros(n, 2, dtype=torch.int64),
        near=torch.zeros(n),
        far=torch.ones(n),
        z_scale=torch.ones(n),
    )


def test_ray_batch_composite_len_index_and_to() -> None:
    batch = make_batch(10, alpha=True)
    assert len(batch) == 10
    white = batch.composite(torch.ones(3))
    torch.testing.assert_close(white, batch.rgb * batch.alpha[:, None] + (1 - batch.alpha[:, None]))  # type: ignore[index]
    # Opaque pixels ignore the background; transparent ones show it.
    opaque = RayBatch(**{**batch.__dict__, "alpha": torch.ones(10)})
    torch.testing.assert_close(opaque.composite([0.0, 0.5, 1.0]), batch.rgb)
    clear = RayBatch(**{**batch.__dict__, "alpha": torch.zeros(10)})
    torch.testing.assert_close(
        clear.composite([0.0, 0.5, 1.0]), torch.tensor([[0.0, 0.5, 1.0]]).expand(10, 3)
    )
    no_alpha = make_batch(4, alpha=False)
    assert no_alpha.composite(torch.zeros(3)) is no_alpha.rgb
    sub = batch[2:5]
    assert len(sub) == 3 and torch.equal(sub.image, torch.tensor([2, 3, 4]))
    moved = no_alpha.to("cpu", non_blocking=True)
    assert moved.alpha is None and torch.equal(moved.rgb, no_alpha.rgb)


def _same(a: RayBatch, b: RayBatch) -> bool:
    """Every field equal, ``extra`` included."""
    for name, value in b.__dict__.items():
        got = getattr(a, name)
        if isinstance(value, dict):
            if got.keys() != value.keys() or not all(torch.equal(got[k], value[k]) for k in value):
                return False
        elif (got is None) != (value is None) or (value is not None and not torch.equal(got, value)):
            return False
    return True


@pytest.mark.parametrize("alpha", [True, False])
def test_ray_batch_split_equals_slices(alpha: bool) -> None:
    batch = make_batch(10, alpha=alpha)
    batch.extra["origins"] = torch.randn(10, 3).half()
    parts = batch.split([3, 0, 7])
    for part, (lo, hi) in zip(parts, [(0, 3), (3, 3), (3, 10)], strict=True):
        want = batch[lo:hi]
        assert _same(part, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cameras", [PINHOLES, PINHOLES + DISTORTED], ids=["pinhole", "mixed"])
def test_cuda_generator_matches_cpu(cameras: list[Camera]) -> None:
    cpu, cuda = make_generator(cameras), make_generator(cameras, device="cuda")
    image, pixel = random_rays(cpu, 1000, 6)
    a, b = cpu.generate(image, pixel), cuda.generate(image.cuda(), pixel.cuda())
    for x, y in zip(a, b, strict=True):
        assert y.device.type == "cuda"
        torch.testing.assert_close(y.cpu(), x, atol=1e-6, rtol=0)
    pid = torch.from_numpy(cpu.pixel_offset[:-1])[image] + pixel[:, 1] * torch.from_numpy(cpu.widths)[image]
    pid += pixel[:, 0]
    img_cuda, pix_cuda, _ = cuda.generate_from_pids(pid.cuda())
    assert torch.equal(img_cuda.cpu(), image) and torch.equal(pix_cuda.cpu(), pixel)
    batch = make_batch(8, alpha=True).pin_memory().to("cuda", non_blocking=True)
    assert batch.rgb.device.type == "cuda"


@pytest.mark.parametrize("float_dtype", [torch.float64, torch.float32])
def test_floor_div_is_exact_for_uint32_ids(float_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(8)
    a = torch.randint(0, 2**32, (10_000,), generator=g, dtype=torch.int64)
    b = torch.randint(1, 2**16, (10_000,), generator=g, dtype=torch.int64)
    # Worst cases for the float64 route: exact multiples and one below them.
    a = torch.cat([a, (a // b) * b, (a // b) * b - 1]).clamp(min=0)
    b = torch.cat([b, b, b])
    divisor = b.to(float_dtype) if float_dtype == torch.float64 else b
    assert torch.equal(pixel_layout.floor_div(a, divisor, float_dtype), a // b)


def test_uniform_pid_decoding_is_exact_up_to_uint32() -> None:
    # 255 images of 4096 x 4095: ids reach 2**32 - 2**20; check both sides of every boundary tried.
    w, h, n = 4096, 4095, 255
    gen = RayGenerator([Camera("PINHOLE", w, h, (1000.0, 1000.0, 2048.0, 2047.5))], np.zeros(n, np.int64),
                       random_poses(n, 3), 0.1, 5.0)  # fmt: skip
    assert gen.pid_decoding == "uniform" and int(gen.pixel_offset[-1]) < 2**32
    rng = np.random.default_rng(0)
    edges = np.concatenate([np.arange(1, n) * w * h, rng.integers(1, n * h, 500) * w])
    pid_np = np.unique(np.concatenate([edges - 1, edges, edges + 1, [0, n * w * h - 1]]))
    want_image, local = np.divmod(pid_np, w * h)
    for dtype in (np.int64, np.uint32):  # the loader passes stored uint32 ids as they are
        image, pixel = gen.decode_pids(torch.from_numpy(pid_np.astype(dtype)))
        assert np.array_equal(image.numpy(), want_image)
        assert np.array_equal(pixel.numpy(), np.stack([local % w, local // w], -1))


@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("cameras", [PINHOLES[:1], DISTORTED[:1]], ids=["uniform-pinhole", "lut"])
def test_batch_from_pids_equals_from_rays(cameras: list[Camera], channels: int) -> None:
    gen = make_generator(cameras, n_images=6)
    image, pixel = random_rays(gen, 500, 3)
    pid = torch.from_numpy(gen.pixel_offset)[image] + pixel[:, 1] * int(gen.widths[0]) + pixel[:, 0]
    rgba = torch.randint(0, 256, (500, channels), dtype=torch.uint8)
    want = RayBatch.from_rays(rgba, *gen.generate_from_pids(pid))
    for ids in (pid, torch.from_numpy(pid.numpy().astype(np.uint32))):
        got = gen.batch_from_pids(ids, rgba)
        assert _same(got, want)
    reference = twin(gen, image, pixel)
    torch.testing.assert_close(got.directions, reference.directions, atol=1e-6, rtol=0)


@pytest.mark.parametrize("block", [1, 64, 499, 500, 1 << 15])
def test_batch_from_pids_in_blocks_equals_one_pass(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path generates in blocks of ``GENERATE_BLOCK`` rays: every block size, partial last
    blocks included, gives the same batch, bit for bit, as ``from_rays`` over the whole batch."""

    gen = make_generator(PINHOLES[:1], n_images=6)
    image, pixel = random_rays(gen, 500, 5)
    pid = torch.from_numpy(gen.pixel_offset)[image] + pixel[:, 1] * int(gen.widths[0]) + pixel[:, 0]
    rgba = torch.randint(0, 256, (500, 4), dtype=torch.uint8)
    want = RayBatch.from_rays(rgba, *gen.generate_from_pids(pid))
    monkeypatch.setattr(rays_module, "GENERATE_BLOCK", block)
    assert _same(gen.batch_from_pids(pid, rgba), want)


def test_unit_colours_are_exact_quotients_on_every_path() -> None:
    """Every uint8 value k gives the correctly rounded float32 k / 255 (numpy's division, computed
    independently), on the CPU's division and in the lookup table other devices use."""
    k = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    expected = k.numpy().astype(np.float32) / np.float32(255.0)
    np.testing.assert_array_equal(unit_colours(k).numpy(), expected)
    table = ray_batch._unit_on(torch.device("cpu"))
    np.testing.assert_array_equal(table[k.to(torch.int32)].numpy(), expected)
    # multiplying by the reciprocal (what CUDA does for a scalar divisor) is not the same
    assert (k.numpy().astype(np.float32) * np.float32(1.0 / 255.0) != expected).sum() > 100
    batch = RayBatch.from_rays(
        k.reshape(-1, 4),
        torch.zeros(64, dtype=torch.int64),
        torch.zeros(64, 2, dtype=torch.int64),
        Rays(*(torch.zeros(64, 3),) * 2, *(torch.zeros(64),) * 3),
    )
    np.testing.assert_array_equal(batch.rgb.numpy(), expected.reshape(-1, 4)[:, :3])
