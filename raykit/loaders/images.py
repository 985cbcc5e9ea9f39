"""``ImageLoader``: whole images for splatting-style trainers (one or a few images per step).

The loader is a few stages, each a small object over the loader's frozen
:class:`~raykit.loaders.config.ImageLoaderConfig` (webdataset's ``DataPipeline`` idea):

* plan (:class:`~raykit.loaders.image_plan.ImagePlan`): ranks, batches, epochs and crops, from the seed;
* view sampling (``views``, :class:`~raykit.loaders.image_plan.ViewSampler`): which views a rank visits
  in an epoch and in what order: :class:`~raykit.loaders.image_plan.UniformViews`, the plan's
  seeded permutation, or (``sampling="loss"``) :class:`~raykit.loaders.image_views.LossViews`, views
  drawn by their losses fed back through :meth:`ImageLoader.observe`;
* source (:class:`~raykit.loaders.image_source.ImageSource`): reading and decoding from the store, at
  one level, undistorted and transformed, in worker processes through the ray loader's
  :class:`~raykit.loaders.fetcher.ChunkFetcher` (an image is one read unit);
* cache (:class:`~raykit.loaders.image_cache.ViewCache`): the decoded images of the level (this
  process's or the machine's) and their components;
* batcher (:class:`~raykit.loaders.image_batcher.ImageBatcher`): crops, cameras, poses, components,
  and the device transfer (:class:`~raykit.loaders.image_batcher.DeviceTransfer`: float conversion
  into recycled buffers).

:class:`ImageBatches` runs them behind ``Prefetch``, or on the calling thread for an epoch whose images
are all cached (a hand-off per batch would cost more than the batch). The user's view:
``docs/loading.md``.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from raykit.errors import ConfigError, ResumeError
from raykit.loaders.arguments import open_if_location
from raykit.loaders.base import BatchLoader, distributed_rank
from raykit.loaders.cache import HeapTrim
from raykit.loaders.config import ImageLoaderConfig
from raykit.loaders.image_batcher import DeviceTransfer, ImageBatch, ImageBatcher
from raykit.loaders.image_cache import ViewCache
from raykit.loaders.image_plan import ImagePlan, UniformViews, ViewSampler
from raykit.loaders.image_source import ImageSource, check_batch_sizes, checked_crop
from raykit.loaders.image_views import LossViews, SynchronousViews, instants_of, view_losses
from raykit.loaders.levels import LevelCache, check_downscale
from raykit.loaders.sampling import SamplingConfig, sampling_record
from raykit.loaders.stages import Positioned
from raykit.store import RayStore

__all__ = ["IMAGE_STATE_VERSION", "ImageBatch", "ImageBatches", "ImageLoader", "ImagePlan", "image_config"]

IMAGE_STATE_VERSION = 1
POSITIONAL = ("split", "batch_size", "seed")  # the options that may also be given by position


def image_config(
    positional: tuple[Any, ...], config: ImageLoaderConfig | None, overrides: Mapping[str, Any]
) -> ImageLoaderConfig:
    """``config`` (default: the defaults) with the options given by position (:data:`POSITIONAL`, or a
    config first) and by name replaced, checked.

    Raises:
        ConfigError: an unknown option, one given twice, or too many positional arguments.
    """
    if positional and isinstance(positional[0], ImageLoaderConfig):
        if config is not None:
            raise ConfigError("image loader: config given twice (by position and as config=)")
        config, positional = positional[0], positional[1:]
    if len(positional) > len(POSITIONAL):
        raise ConfigError(
            f"image loader: at most {len(POSITIONAL)} options by position ({', '.join(POSITIONAL)}), "
            f"got {len(positional)}"
        )
    given = dict(zip(POSITIONAL, positional, strict=False))
    twice = sorted(set(given) & set(overrides))
    fields = ImageLoaderConfig.__dataclass_fields__
    unknown = sorted(set(overrides) - set(fields))
    if twice or unknown:
        problem = f"option {twice[0]!r} given twice" if twice else f"unknown option {unknown[0]!r}"
        raise ConfigError(f"image loader: {problem}; the options are {', '.join(fields)}")
    changes = {**given, **overrides}
    base = ImageLoaderConfig() if config is None else config
    return base.replace(**changes) if changes or config is None else base


class ImageLoader(BatchLoader):
    """Yields :class:`ImageBatch` es of one split, epoch after epoch.

    ``ImageLoader(store, split, batch_size, seed, **options)``, ``ImageLoader(store, config)`` or
    ``ImageLoader(store, config=config, **overrides)``: the options are the fields of
    :class:`~raykit.loaders.config.ImageLoaderConfig` (their defaults, meanings and checks are written
    there once), by name; ``split``, ``batch_size`` and ``seed`` also by position.

    Args:
        store: a :class:`raykit.store.RayStore` or a store path or URL.

    Attributes:
        config: the options, checked and frozen.
        plan, views, source, cached, batcher: the stages (module docstring); ``cache`` is the cache of
            decoded images (``cached.images``).
    """

    STATE_VERSION = IMAGE_STATE_VERSION
    _what = "image loader state"
    store: RayStore

    def __init__(
        self,
        store: RayStore | str | os.PathLike[str],
        *positional: Any,
        config: ImageLoaderConfig | None = None,
        **overrides: Any,
    ) -> None:
        cfg = self.config = image_config(positional, config, overrides)
        opened = open_if_location(store)
        if not isinstance(opened, RayStore):
            raise ConfigError(f"image loader: store: expected a RayStore or a store location, got {store!r}")
        store = opened
        if cfg.split not in store.splits:
            raise ConfigError(
                f"image loader: {store.url}: no split {cfg.split!r}; expected one of {sorted(store.splits)}"
            )
        self.store, self.split, self.device = store, cfg.split, torch.device(cfg.device)
        self.source = ImageSource(store, cfg.split, cfg.undistort, cfg.transform)
        self.transform = cfg.transform
        self._schedule = cfg.downscale if callable(cfg.downscale) else None
        first = cfg.downscale(0) if callable(cfg.downscale) else cfg.downscale  # a new loader is at step 0
        if first != 1:
            self.source = self._level_source(first)
        self.crop = checked_crop(cfg.crop, self.source)
        check_batch_sizes(self.source, cfg.batch_size, self.crop)
        rank, world_size = distributed_rank(cfg.rank, cfg.world_size)
        n_images, instants = self.source.n_images, None
        if cfg.synchronous:
            instants = _instants(store, cfg.split, self.source.rows, cfg.batch_size)
            n_images = instants.shape[1] * world_size * (len(instants) // world_size)
        self.plan = ImagePlan(
            n_images, cfg.batch_size, cfg.seed, cfg.shuffle, cfg.drop_last, world_size, rank
        )
        self.undistort, self.num_workers, self.prefetch = cfg.undistort, cfg.num_workers, cfg.prefetch
        sampling = cast(SamplingConfig, cfg.sampling)
        views: ViewSampler = (
            LossViews(self.plan, sampling) if sampling.kind == "loss" else UniformViews(self.plan)
        )
        if instants is not None:
            views = SynchronousViews(self.plan, instants)
        self.cached = cached = ViewCache(store, cfg, self.source, views)
        self._position_of_row = {int(row): k for k, row in enumerate(self.source.rows)}
        self.components = cached.components
        self._trim = HeapTrim()
        self.convert_threads = cfg.convert_threads or min(2, os.cpu_count() or 1)
        components_of = None
        if self.components:
            components_of = lambda epoch, p: cached.components_of(p, cached.upcoming(epoch, p))  # noqa: E731
        transfer = DeviceTransfer(self.device, self.convert_threads)
        self.batcher = ImageBatcher(self.source, self.plan, self.crop, transfer, components_of)
        self._pending: ImageSource | None = None  # a level asked for while iterating (``set_downscale``)
        self._live = self._closes = 0  # iterators running; ``close()`` calls
        self._start()

    @property
    def cache(self) -> LevelCache:
        """The cache of decoded images at the served level."""
        return self.cached.images

    @property
    def views(self) -> ViewSampler:
        """The view-sampling stage (``UniformViews`` unless another is set): which views this rank
        visits in each epoch, from the next iteration on."""
        return self.cached.views

    @views.setter
    def views(self, sampler: ViewSampler) -> None:
        self.close()  # iterators in hand start again from the position, with the new views
        self.cached.set_views(sampler)

    def observe(self, batch: ImageBatch, losses: Any) -> None:
        """Feed back the loss of each view of ``batch`` (one this loader yielded; ``losses`` a tensor or
        array of shape ``(len(batch),)``, detached and copied to the host here) to the view-sampling
        stage (a no-op for uniform views). The views of an epoch are drawn when it starts, from the
        losses observed before (``docs/loading.md``, "View sampling").

        Raises:
            ConfigError: ``losses`` is not one finite, non-negative number per view of ``batch``.
        """
        values = view_losses(losses, len(batch))
        observe = getattr(self.views, "observe", None)
        if observe is not None:
            rows = batch.image.tolist()
            positions = np.asarray([self._position_of_row.get(int(row), -1) for row in rows], np.int64)
            if (positions < 0).any():
                raise ConfigError(f"image loader: observe: a batch of another split (rows {rows})")
            observe(positions, values)

    # ---- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[ImageBatch]:
        """The remaining batches of the current epoch; assembled on this thread when all of the
        epoch's images are cached, else by a producer thread. With a ``downscale`` schedule, each at
        the level the schedule gives for its step."""
        return self._iterate()

    def _iterate(self) -> Generator[ImageBatch, None, None]:
        """The epoch's batches from :meth:`_epoch_batches`, started again from the loader's position
        when the level changes between two of them (a schedule) or the loader was closed meanwhile
        (its producer thread is gone); a level asked for meanwhile is taken at the next iteration."""
        self._live += 1
        try:
            while True:
                if self._pending is not None:
                    self._set_level(self._pending)
                if self._schedule is not None:
                    self._set_level(self._schedule(self.step()))
                closes, level = self._closes, self.downscale
                batches = self._epoch_batches()
                try:
                    for batch in batches:
                        yield batch
                        if self.batch >= self.plan.n_batches:
                            continue  # the epoch's end: nothing to start again
                        if self._closes != closes:
                            break
                        if self._schedule is not None and self._schedule(self.step()) != level:
                            break
                    else:
                        return
                finally:
                    batches.close()
        finally:
            self._live -= 1

    def step(self) -> int:
        """The step of the next batch: batches served before it over all epochs
        (``epoch * n_batches + batch``), what a ``downscale`` schedule is given."""
        if self.batch >= self.plan.n_batches:
            return (self.epoch + 1) * self.plan.n_batches
        return self.epoch * self.plan.n_batches + self.batch

    def _epoch_batches(self) -> Generator[ImageBatch, None, None]:
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        cached = self.cached.holds(self.views.epoch_views(epoch))
        return self._counted(ImageBatches(self, cached), 0 if cached else self.prefetch, "raykit-images")

    # ---- resolution levels -------------------------------------------------------------------
    @property
    def downscale(self) -> int:
        """The resolution level served (images at 1/downscale)."""
        return self.source.downscale

    def _level_source(self, factor: Any) -> ImageSource:
        source = self.source
        factor = check_downscale(factor, source.names, source.full_shapes)
        return ImageSource(self.store, self.split, source.undistort, self.transform, factor)

    def set_downscale(self, factor: int) -> None:
        """Serve level ``factor``: at once between iterations; called while an iterator is running
        (inside ``for batch in loader:``), from the loader's next iteration (the next epoch, or where
        a loop left off). The other levels' cached images are then freed, so the new level has the
        whole budget. The position (epoch, batch), the order and the crops' seeds are unchanged. With
        a ``downscale`` schedule, the schedule chooses again when the loader is next iterated.

        Raises:
            ConfigError: at once: not a positive integer, an image left without pixels, or a ``crop``
                larger than an image at that level.
        """
        if factor == self.downscale:
            self._pending = None
            return
        level = self._level_source(factor)
        checked_crop(self.crop, level)
        if self._live:
            self._pending = level
        else:
            self._set_level(level)

    def _set_level(self, level: ImageSource | int) -> None:
        """Serve ``level`` (a source, or a factor) now: live iterators start again from the position."""
        self._pending = None
        if isinstance(level, int) and level == self.downscale:
            return
        level = level if isinstance(level, ImageSource) else self._level_source(level)
        self.crop = checked_crop(self.crop, level)
        self.close()  # live iterators and workers hold the old level
        self.source = level
        self.cached.set_source(level)
        self.batcher.set_source(level, self.crop)

    def preload(self) -> int:
        """Read this rank's images into the cache now, in the order of the next epoch, while they fit
        (all of them when the capture fits ``cache_bytes``); the number cached.

        Afterwards a capture that fits is served from the cache on the calling thread from the first
        batch on (nerfstudio's full-image datamanager likewise decodes everything at setup). The
        served components (``components``) of the same images are read too, while they fit theirs.
        """
        if self.source.shuffled_rays:
            self.cached.fill(self.epoch)
            self.cached.preload_components(range(self.source.n_images))
            return len(self.cache)
        epoch = self.epoch + 1 if self.batch >= self.plan.n_batches else self.epoch
        room = self.cache.capacity - self.cache.stats().bytes
        order = dict.fromkeys(int(p) for p in self.views.epoch_views(epoch))
        chosen = self.cached.fitting(order, room)
        for _ in self._fetcher_ready().fetch(chosen):
            pass
        self.cached.filled = True
        self.cached.preload_components(order)
        return len(self.cache)

    # ---- state -------------------------------------------------------------------------------
    def _state_tag(self) -> dict[str, Any]:
        return {"kind": "images"}

    def _plan_fields(self) -> dict[str, Any]:
        plan = self.plan
        crop = None if self.crop is None else list(self.crop)
        fields = {"n_images": plan.n_images, "seed": plan.seed, "shuffle": plan.shuffle, "crop": crop,
                  "undistort": self.undistort}  # fmt: skip
        sampling = cast(SamplingConfig, self.config.sampling)
        if sampling.kind != "uniform":  # a uniform loader's state is as it was
            fields["view_sampling"] = sampling_record(sampling)
        if self.config.synchronous:
            fields["synchronous"] = True
        return fields

    def state_dict(self) -> dict[str, Any]:
        """Small JSON-able position (``BatchLoader.state_dict``), with the view-sampling stage's state
        under ``"views"`` when it keeps one."""
        views = self.views.state_dict()
        return {**super().state_dict(), **({"views": views} if views else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.views.load_state_dict(state.get("views", {}))

    def _check_version(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != IMAGE_STATE_VERSION or state.get("kind") != "images":
            raise ResumeError(
                f"image loader state: expected version {IMAGE_STATE_VERSION} of kind 'images', got "
                f"{state.get('version')!r} of kind {state.get('kind')!r}"
            )

    def _lookahead(self) -> int:
        return self.prefetch + 2 * self.num_workers

    def close(self) -> None:
        super().close()
        self._closes = getattr(self, "_closes", 0) + 1
        batcher = getattr(self, "batcher", None)
        if batcher is not None:
            batcher.transfer.close()


class ImageBatches(Positioned):
    """Stage images -> lists of one :class:`ImageBatch`, from ``{"epoch", "batch"}`` on: each batch's
    images read through ``loader``'s fetcher (after filling its cache, ``ViewCache.fill``) or, with
    ``cached``, straight from its cache (which never evicts)."""

    def __init__(self, loader: ImageLoader, cached: bool) -> None:
        self.loader, self.cached = loader, cached

    def __iter__(self) -> Iterator[list[ImageBatch]]:
        loader, epoch, plan = self.loader, self.epoch, self.loader.plan
        if not self.cached:
            loader.cached.fill(epoch)
        views, size = loader.views.epoch_views(epoch), plan.batch_size
        probs = loader.views.epoch_probs(epoch) if isinstance(loader.views, LossViews) else None
        starts = range(self.batch * size, plan.n_batches * size, size)
        batches = [views[k : k + size] for k in starts]
        wanted = [int(p) for b in batches for p in b]
        if self.cached:
            images = (loader.cache.get(p) for p in wanted)
        else:
            images = (image for _, image in loader._fetcher_ready().fetch(wanted))
        for start, positions in zip(starts, batches, strict=True):
            read = [cast(np.ndarray, next(images)) for _ in positions]
            batch = loader.batcher(epoch, positions, read)
            if probs is not None:
                prob = torch.from_numpy(probs[start : start + len(positions)].astype(np.float32))
                batch.prob = loader.batcher.transfer.small(prob)
            if not self.cached:  # images read and batches made on this thread, freed by the consumer
                loader._trim.add(sum(image.nbytes for image in read) + batch.images.nbytes)
            self.batch += 1
            yield [batch]


def _instants(store: RayStore, split: str, rows: np.ndarray, batch_size: int) -> np.ndarray:
    """(instants, cameras) positions of ``split``'s views (``instants_of``), for a ``batch_size`` of
    whole instants."""
    table = store.table
    times = None if table.time is None else table.time[rows]
    cameras = None if table.rig_camera is None else table.rig_camera[rows]
    instants = instants_of(times, cameras, f"{store.url} split {split!r}")
    if batch_size % instants.shape[1]:
        raise ConfigError(
            f"image loader: synchronous: batch_size {batch_size} is not a multiple of the "
            f"{instants.shape[1]} cameras per instant of split {split!r}"
        )
    return instants
