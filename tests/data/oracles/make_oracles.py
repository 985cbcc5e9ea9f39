"""Writes ``oracles.json``: the outside oracles' values on the inputs of ``cases.py``, which the tests
compare raykit's metrics against on every machine (no oracle package needed to run them).

- nerfbaselines 1.2.12 (``nerfbaselines.metrics``, ``nerfbaselines.utils``): PSNR and SSIM of every pair
  tests/metrics and tests/evaluation score, as its ``compute_metrics`` makes them (``psnr(mse(pred,
  gt))``, ``ssim(gt, pred)`` of ``uint8 / 255`` in float32), and ``image_to_srgb`` of RGBA and float
  images.
- lpips 0.1.4 (``lpips.LPIPS``, version 0.1): LPIPS of seeded image pairs for both nets, AlexNet and VGG16,
  on the seeded random weights of ``cases.lpips_weights`` (the trunk loaded into the package's torchvision
  slices, the heads through ``model_path``), so nothing is downloaded.

How to run it (the lpips package imports torchvision; raykit's environment need not have either): in a
throwaway virtual environment, e.g. on x86_64 with Python 3.11::

    python3 -m venv /tmp/oracles
    /tmp/oracles/bin/pip install torch==2.14.1 torchvision==0.29.1 numpy pillow scipy tqdm
    /tmp/oracles/bin/pip install --no-deps nerfbaselines==1.2.12 lpips==0.1.4
    /tmp/oracles/bin/python tests/data/oracles/make_oracles.py

The file records the versions it was made with. Rerun it after changing ``cases.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import cases
import numpy as np
import torch

OUT = Path(__file__).resolve().with_name("oracles.json")


def metrics(a: np.ndarray, b: np.ndarray) -> dict[str, list[float]]:
    """nerfbaselines' PSNR and SSIM of a batch of (prediction ``a``, ground truth ``b``) uint8 pairs."""
    from nerfbaselines import metrics as nb

    af, bf = a.astype(np.float32) / 255.0, b.astype(np.float32) / 255.0
    return {
        "psnr": np.asarray(nb.psnr(nb.mse(af, bf))).tolist(),
        "ssim": np.asarray(nb.ssim(bf, af)).tolist(),
    }


def _slice_of(net: str, index: int) -> int:
    """The lpips package's slice holding torchvision's ``features.<index>`` (slices end at these)."""
    ends = {"alex": (2, 5, 8, 10), "vgg": (4, 9, 16, 23)}[net]
    return 1 + sum(index >= end for end in ends)


def lpips_values(net: str, seed: int) -> dict[str, object]:
    import lpips

    trunk, heads = cases.lpips_weights(net, seed)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(heads, Path(tmp) / "heads.pth")
        model = lpips.LPIPS(net=net, pretrained=True, pnet_rand=True, model_path=str(Path(tmp) / "heads.pth"),
                            verbose=False)  # fmt: skip
    state = {}
    for name, value in trunk.items():
        if name.startswith("features."):
            index, kind = name.split(".")[1:]
            state[f"slice{_slice_of(net, int(index))}.{index}.{kind}"] = value
    model.net.load_state_dict(state)
    model.eval()
    a, b = cases.lpips_images(seed)
    signed = [torch.from_numpy(x).permute(0, 3, 1, 2).float() / 127.5 - 1 for x in (a, b)]
    with torch.no_grad():
        values = model(*signed).flatten().double().tolist()
    return {
        "seed": seed,
        "weights": cases.weights_key(trunk, heads),
        "images": cases.key(a, b),
        "values": values,
    }


def main() -> int:
    import lpips
    import nerfbaselines
    from nerfbaselines import utils as nb_utils

    pairs = [cases.noisy_pairs(seed, shape) for seed, shape in cases.RANDOM_CASES.items()]
    pairs.append(cases.photo_pairs())
    pairs += [(pred[None], gt[None]) for pred, gt in cases.evaluation_pairs()]
    rgba, background, floats = cases.srgb_inputs()
    document = {
        "made_by": "tests/data/oracles/make_oracles.py (see its docstring)",
        "versions": {
            "nerfbaselines": nerfbaselines.__version__,
            "lpips": getattr(lpips, "__version__", "0.1.4"),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "metrics": {cases.key(a, b): metrics(a, b) for a, b in pairs},
        "image_to_srgb": {
            cases.key(rgba, background): nb_utils.image_to_srgb(
                rgba, np.uint8, background_color=background
            ).tolist(),
            cases.key(floats): nb_utils.image_to_srgb(floats, np.uint8).tolist(),
        },
        "lpips": {net: lpips_values(net, seed) for net, seed in cases.LPIPS_SEEDS.items()},
    }
    OUT.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    print(f"{OUT}: {len(document['metrics'])} metric pairs, LPIPS of {', '.join(document['lpips'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
