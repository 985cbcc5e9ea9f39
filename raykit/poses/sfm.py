"""The pycolmap steps of pose estimation, each interruptible and with a progress bar.

Every step runs pycolmap in a worker thread (pycolmap releases the GIL) while this thread draws the
progress bar, polling the feature database read-only. Ctrl-C (``KeyboardInterrupt``) cancels the
step through pycolmap's cancellation token, waits for pycolmap to stop and re-raises; the feature
database is SQLite, written in transactions, so it is always consistent and a rerun continues from
it: extraction skips photos that already have features and matching skips pairs already matched.
Progress is read from the database through pycolmap's own connection (see :func:`database_counter`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.progress import progress as progress_bar

__all__ = [
    "database_counter",
    "discard_matches",
    "extract",
    "import_pycolmap",
    "map_incremental",
    "match",
    "quiet_pycolmap",
    "run_cancellable",
    "undistort",
    "verified_pairs",
]

_POLL_S = 0.2
_IMPORT_SLICE = 32  # photos imported per pycolmap call (Ctrl-C is seen between calls)


def import_pycolmap() -> Any:
    """The pycolmap module (a clear error when it is missing)."""
    try:
        import pycolmap
    except ImportError as exc:  # pragma: no cover - pycolmap is a declared dependency
        raise ConfigError(f"pose estimation needs pycolmap (pip install 'pycolmap>=4.0,<5'): {exc}") from None
    return pycolmap


@contextlib.contextmanager
def quiet_pycolmap() -> Iterator[None]:
    """Silence pycolmap's per-image log lines (errors still show) for the duration of the block."""
    logging = import_pycolmap().logging
    previous = logging.minloglevel
    logging.minloglevel = 2
    try:
        yield
    finally:
        logging.minloglevel = previous


@contextlib.contextmanager
def database_counter(database: Path, what: str) -> Iterator[Callable[[], int | None]]:
    """A poll function counting ``what`` in the feature database (the database is created if missing).

    ``what``: ``features`` (images whose keypoints are in) or ``matched_pairs``.

    The database is opened through pycolmap itself: a second SQLite library in the same process (the
    ``sqlite3`` module) must never touch a database that pycolmap is writing, since closing its file
    handle would drop pycolmap's POSIX locks. The poll returns None while the database is busy.
    """
    pycolmap = import_pycolmap()
    db = pycolmap.Database.open(str(database))
    seen: list[int] = [-1]  # images in the database at the last read of their ids
    waiting: list[int] = []  # the ids of those without keypoints at the last count (checked again only)

    def with_features() -> int:
        images = db.num_images()
        if images != seen[0]:  # photos were imported since: read the ids again
            seen[0], waiting[:] = images, [image.image_id for image in db.read_all_images()]
        waiting[:] = [image_id for image_id in waiting if not db.exists_keypoints(image_id)]
        return images - len(waiting)

    method = with_features if what == "features" else db.num_matched_image_pairs

    def poll() -> int | None:
        try:
            return int(method())
        except Exception:  # busy while pycolmap writes: skip this update
            return None

    try:
        yield poll
    finally:
        db.close()


def discard_matches(database: Path, *, raw: bool) -> None:
    """Drop every pair's geometric verification, and with ``raw`` its raw matches too.

    pycolmap's matchers skip a pair that already has both, and verify a pair that has only raw
    matches; raw matches depend on the features alone, verification also on the seed.
    """
    db = import_pycolmap().Database.open(str(database))
    try:
        db.clear_two_view_geometries()
        if raw:
            db.clear_matches()
    finally:
        db.close()


def verified_pairs(database: Path) -> int:
    """Number of image pairs with geometrically verified matches (call when no stage is running)."""
    db = import_pycolmap().Database.open(str(database))
    try:
        _, geometries = db.read_two_view_geometries()
        return sum(1 for g in geometries if len(g.inlier_matches) > 0)
    finally:
        db.close()


def run_cancellable(
    work: Callable[[Any], Any],
    *,
    desc: str,
    total: int | None,
    poll: Callable[[], int | None] | None,
    progress: bool,
    unit: str = "photo",
) -> Any:
    """Run ``work(cancellation_token)`` in a thread with a progress bar updated from ``poll()``.

    Returns what ``work`` returns; re-raises its exception. On ``KeyboardInterrupt`` the token is
    cancelled and the interrupt re-raised only once the thread has stopped (a pycolmap thread still
    running when the interpreter exits would abort the process). The wait uses an event set by the
    thread rather than ``Thread.join``, whose state an interrupt can leave wrong on some Pythons.
    """
    token = import_pycolmap().CancellationToken()
    result: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            result["value"] = work(token)
        except BaseException as exc:
            result["error"] = exc
        finally:
            finished.set()

    thread = threading.Thread(target=target, name=f"raykit-{desc}", daemon=True)
    with progress_bar(total=total, desc=desc, unit=unit, disable=not progress, leave=True) as bar:
        thread.start()
        try:
            while not finished.wait(_POLL_S):
                done = poll() if poll is not None else None
                if done is not None and done != bar.n:
                    bar.update(done - bar.n)
        except KeyboardInterrupt:
            token.cancel()
            _wait_through_interrupts(finished)
            raise
        if total is not None and "error" not in result:
            bar.update(total - bar.n)
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _wait_through_interrupts(finished: threading.Event) -> None:
    """Wait for ``finished``; further Ctrl-C presses only repeat the wait (cancelling takes moments)."""
    while True:
        try:
            if finished.wait(_POLL_S):
                return
        except KeyboardInterrupt:
            continue


def extract(
    database: Path,
    images: Path,
    names: Sequence[str],
    *,
    camera_model: str,
    single: bool,
    max_image_size: int,
    max_features: int,
    threads: int,
    progress: bool,
) -> None:
    """SIFT features of ``names`` (relative to ``images``) into ``database``."""
    pycolmap = import_pycolmap()
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = camera_model
    options = pycolmap.FeatureExtractionOptions()
    options.max_image_size = max_image_size
    options.num_threads = threads
    options.sift.max_num_features = max_features
    mode = pycolmap.CameraMode.SINGLE if single else pycolmap.CameraMode.PER_IMAGE

    def work(token: Any) -> None:
        # The images (and their cameras) enter the database first, one after another in name order,
        # so that their ids, and with them the matches and the model, are the same on every run:
        # extraction's worker threads number new images in the order they finish. On a resumed
        # extraction the images already in are kept as they are. The import reads every photo and
        # takes no token: in slices, so that a Ctrl-C waits for one slice at most. Each slice starts
        # with the previous one's last photo, already in: pycolmap takes the camera to share (one
        # camera for all) from it, where a slice of new photos only would add a camera.
        for start in range(0, len(names), _IMPORT_SLICE):
            if token.is_cancelled:
                return
            part = list(names[max(start - 1, 0) : start + _IMPORT_SLICE])
            pycolmap.import_images(database, images, camera_mode=mode, image_names=part, options=reader)
        pycolmap.extract_features(
            database,
            images,
            image_names=list(names),
            camera_mode=mode,
            reader_options=reader,
            extraction_options=options,
            cancellation_token=token,
        )

    with database_counter(database, "features") as poll:
        run_cancellable(work, desc="features", total=len(names), progress=progress, poll=poll)


def _pair_count(pycolmap: Any, database: Path, sequential: bool) -> int:
    db = pycolmap.Database.open(str(database))
    try:
        if sequential:
            return len(pycolmap.SequentialPairGenerator(pycolmap.SequentialPairingOptions(), db).all_pairs())
        return len(pycolmap.ExhaustivePairGenerator(pycolmap.ExhaustivePairingOptions(), db).all_pairs())
    finally:
        db.close()


def match(
    database: Path, *, sequential: bool, brute_force: bool, threads: int, seed: int, progress: bool
) -> None:
    """Match features between image pairs (all pairs, or neighbours in name order) and verify them.

    The verification's RANSAC draws from ``seed`` (pycolmap's default seeds each worker thread from
    the clock, so two runs on the same photos verified different inliers). ``brute_force``: exact
    nearest neighbours instead of pycolmap's FAISS index (see docs/poses.md, "Reproducible").
    """
    pycolmap = import_pycolmap()
    options = pycolmap.FeatureMatchingOptions()
    options.num_threads = threads
    options.sift.cpu_brute_force_matcher = brute_force
    verification = pycolmap.TwoViewGeometryOptions()
    verification.ransac.random_seed = seed
    total = _pair_count(pycolmap, database, sequential)

    def work(token: Any) -> None:
        matcher = pycolmap.match_sequential if sequential else pycolmap.match_exhaustive
        matcher(
            database, matching_options=options, verification_options=verification, cancellation_token=token
        )

    with database_counter(database, "matched_pairs") as poll:
        run_cancellable(work, desc="matching", total=total, progress=progress, unit="pair", poll=poll)


def map_incremental(
    database: Path, images: Path, out: Path, *, n_images: int, threads: int, seed: int, progress: bool
) -> dict[int, Any]:
    """Incremental mapping; returns pycolmap's reconstructions by index (models also written in ``out``)."""
    pycolmap = import_pycolmap()
    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = threads
    options.random_seed = seed
    pycolmap.set_random_seed(seed)
    registered = [0]

    def work(token: Any) -> dict[int, Any]:
        def initial_pair() -> None:
            registered[0] += 2

        def next_image() -> None:
            registered[0] += 1

        return dict(
            pycolmap.incremental_mapping(
                database,
                images,
                out,
                options=options,
                initial_image_pair_callback=initial_pair,
                next_image_callback=next_image,
                cancellation_token=token,
            )
        )

    result: dict[int, Any] = run_cancellable(
        work,
        desc="mapping",
        total=n_images,
        progress=progress,
        poll=lambda: min(registered[0], n_images),
    )
    return result


def undistort(model: Path, images: Path, out: Path, *, threads: int, progress: bool) -> None:
    """Undistorted images and PINHOLE model in ``out/images`` and ``out/sparse`` (pycolmap's undistorter)."""
    pycolmap = import_pycolmap()

    def work(token: Any) -> None:
        pycolmap.undistort_images(out, model, images, num_threads=threads, cancellation_token=token)

    run_cancellable(work, desc="undistort", total=None, poll=None, progress=progress)
