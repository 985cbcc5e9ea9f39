"""SPEC: every bad entry is one line naming the SPEC and the entry, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raykit.errors import ConfigError
from raykit.sweep import config_hash, load_spec

CAPTURE = '\n[[captures]]\nscene = "tiny"\n'


def test_a_grid_crossed_with_a_list_and_the_seeds(tmp_path: Path, spec_writer: Any) -> None:
    body = (
        """seeds = [3, 4, 5]
[evaluation]
metric = "lpips"
max_images = 2
[grid]
sampler = ["occupancy", "proposal"]
lr = [0.01, 0.005]
[[configs]]
name = "small"
hidden = 16
[[configs]]
name = "big"
hidden = 64
"""
        + CAPTURE
    )
    spec = load_spec(spec_writer(tmp_path / "s.toml", body, ""))
    assert spec.seeds == (3, 4, 5) and spec.metric == "lpips" and not spec.higher_is_better
    assert len(spec.configs) == 8
    names = [c.name for c in spec.configs]
    assert names[0] == "small,sampler=occupancy,lr=0.01" and names[-1] == "big,sampler=proposal,lr=0.005"
    big = spec.configs[-1].train
    assert (big.hidden, big.sampler, big.lr, big.eval_max_images) == (64, "proposal", 0.005, 2)
    assert len({c.hash for c in spec.configs}) == 8
    # where a run executes is not part of its identity, what it computes is
    assert config_hash(big.replace(threads=7, out="/x")) == config_hash(big)
    assert config_hash(big.replace(lr=0.001)) != config_hash(big)
    (capture,) = spec.captures
    assert capture.name == "scene-tiny"


@pytest.mark.parametrize(
    ("body", "entry"),
    [
        ("bogus = 1" + CAPTURE, "bogus: unknown field"),
        ("[train]\nlearning_rate = 0.1" + CAPTURE, "train.learning_rate: unknown field"),
        ('[train]\nlr = "fast"' + CAPTURE, "train.lr: expected a number, got 'fast'"),
        ("[train]\nsteps = 2.5" + CAPTURE, "train.steps: expected an integer"),
        ("[train]\nseed = 3" + CAPTURE, "train.seed: set by the sweep"),
        ("[[configs]]\nname = 'neg'\nlr = -1.0" + CAPTURE, "configuration 'neg': invalid training config"),
        ('[grid]\nsampler = ["occupancy", "nope"]' + CAPTURE, "configuration 'sampler=nope': invalid"),
        ("[grid]\nsampler = []" + CAPTURE, "grid.sampler: expected a non-empty list"),
        ("[evaluation]\nsplitz = 'test'" + CAPTURE, "evaluation.splitz: unknown field"),
        ("seeds = [1, 1]" + CAPTURE, "seeds: seed 1 listed twice"),
        ("[[configs]]\nname='a'\nlr=0.01\n[[configs]]\nname='b'\nlr=0.01" + CAPTURE,
         "configuration 'b': the same configuration as 'a'"),
        (CAPTURE + CAPTURE, "capture 'scene-tiny': the same capture as 'scene-tiny'"),
        ('[[captures]]\npath = "missing/capture"', "captures[0].path: "),
        ('[[captures]]\nscene = "huge"', "captures[0].scene: expected one of tiny, small, realistic"),
        ('[[captures]]\nscene = "tiny"\ndownscale = "2"', "captures[0].downscale: expected an integer"),
        ('[[captures]]\nscene = "tiny"\nfoo = 1', "captures[0].foo: unknown field"),
        ("seeds = [0]", "captures: expected a non-empty array"),
        ("seeds = [0\n", "not valid TOML"),
    ],
)  # fmt: skip
def test_each_bad_entry_is_one_line_naming_it(
    tmp_path: Path, spec_writer: Any, body: str, entry: str
) -> None:
    path = spec_writer(tmp_path / "spec.toml", body, "")
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and entry in message and "\n" not in message, message


def test_a_missing_capture_names_the_path(tmp_path: Path, spec_writer: Any) -> None:
    path = spec_writer(tmp_path / "spec.toml", '[[captures]]\npath = "nowhere"\n', "")
    with pytest.raises(ConfigError, match=r"captures\[0\]\.path: .*nowhere: capture not found"):
        load_spec(path)


def test_the_command_exits_2_with_one_line_before_any_run(
    tmp_path: Path, spec_writer: Any, sweep_cli: Any
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", "[train]\nlr = 'x'\n" + CAPTURE, "")
    done = sweep_cli(spec, tmp_path / "out", check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"raykit: error: {spec}: train.lr: expected a number, got 'x'"
    ]
    assert not (tmp_path / "out").exists()
