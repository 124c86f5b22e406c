"""Splitting models exported with an attention mask: the mask every layer reads is a side tensor, made once by
the first piece and passed to every later piece, so the layers are still cut apart and reused, and the
stitched plan computes what the model computes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from unity_eq import check, optimize
from unity_eq.frontends.onnx import load_onnx
from unity_eq.split import split_graph

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks.models import _hf  # noqa: E402

LAYERS, BATCH, SEQ = 3, 8, 64  # batch 8: the plan is data parallel, each layer slices the mask


@pytest.fixture(scope="module")
def masked_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT of 3 layers (hidden 64) exported with ``input_ids`` and ``attention_mask`` inputs."""
    return _hf("bert", LAYERS, 64, 2, batch=BATCH, seq=SEQ, mask=True)(tmp_path_factory.mktemp("bert-mask"))


def test_the_mask_is_a_side_input_of_every_layer(masked_bert: Path) -> None:
    split = split_graph(load_onnx(masked_bert))
    assert split is not None
    first, *later = split.pieces
    # Without side tensors the mask is live at every layer boundary and the model splits into two pieces.
    assert len(split.pieces) >= 2 * LAYERS
    assert first.side_out and not first.side_in
    readers = [p for p in later if p.side_in]
    assert len(readers) == LAYERS  # the attention block of each layer reads the mask
    assert all(set(p.side_in) <= set(first.side_out) for p in readers)
    assert len({p.signature for p in readers}) == 1  # identical layers: one signature, saturated once
    assert all(p.stream_in is not None for p in later)


def test_a_plan_with_side_inputs_checks(masked_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    blocked = optimize(masked_bert, devices=2, mesh="2", objective="training", blocks="on", output_dir=out)
    assert blocked.plan.validate() == []
    meta = json.loads((out / "plan.json").read_text())
    assert meta["blocks"]["pieces"] > meta["blocks"]["distinct"]
    split = split_graph(load_onnx(masked_bert))
    assert split is not None
    (mask,) = split.pieces[0].side_out
    makers = [s for s in blocked.plan.steps if mask in getattr(s, "outputs", ())]
    readers = [s for s in blocked.plan.steps if mask in (getattr(s, "src", None), *getattr(s, "inputs", ()))]
    assert len(makers) == 1 and len(readers) >= LAYERS  # made once, read by every layer
    # Padding that differs between the rows, so a wrongly routed mask would change the outputs.
    rng = np.random.default_rng(0)
    attention_mask = np.ones((BATCH, SEQ), dtype=np.int64)
    attention_mask[0, SEQ // 2 :] = 0
    attention_mask[5, SEQ - 3 :] = 0
    inputs = {"input_ids": rng.integers(0, 1000, (BATCH, SEQ)).astype(np.int64), "attention_mask": attention_mask}
    outcome = check(masked_bert, out, inputs=inputs)
    assert outcome.passed, outcome.describe()
