"""The report's PSNR-against-time curve: one measurement on one image set, in time order, labelled."""

from __future__ import annotations

from raykit.pipeline.report import psnr_curve


def test_curve_holds_the_progress_checks_only_in_time_order_and_names_the_subset() -> None:
    run = {
        "psnr": 27.0,  # the final evaluation, on all 10 test images: not a point of the curve
        "elapsed_s": 61.0,
        "n_images": 10,
        "progress": [  # as a resumed run may leave them: not in time order
            {"step": 300, "elapsed_s": 30.0, "psnr": 24.0, "n_images": 1},
            {"step": 100, "elapsed_s": 10.0, "psnr": 20.0, "n_images": 1},
            {"step": 610, "elapsed_s": 61.0, "psnr": 28.7, "n_images": 1},
            {"step": 200, "elapsed_s": 20.0, "psnr": None, "n_images": 1},
        ],
    }
    curve, label = psnr_curve("occupancy", run)
    assert curve == [(10.0, 20.0), (30.0, 24.0), (61.0, 28.7)]
    assert "first 1 of 10 test images (a subset)" in label and label.startswith("occupancy")
    run["progress"] = [{**p, "n_images": 10} for p in run["progress"]]
    assert psnr_curve("occupancy", run)[1] == "occupancy: progress checks, 10 test images"
    assert psnr_curve("occupancy", {"progress": []}) == ([], "occupancy: progress checks")
