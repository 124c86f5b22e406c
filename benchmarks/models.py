"""The benchmark models, made on demand into a cache directory (never committed).

* the bundled examples (examples/mlp.onnx, examples/transformer.onnx);
* onnx's light CNNs with random weights (tests/model_zoo.py);
* transformers exported from PyTorch with the dynamo exporter and random weights (transformers builds them
  from a config; nothing is downloaded): BERT-Base (12 × 768), BERT-Large (24 × 1024) and GPT-2-XL depth
  (48 × 1600), batch 8 × sequence 128, weights as external data;
* the same exported as people distribute them, with an ``attention_mask`` input (the extended mask every layer
  reads is a side tensor of the split: docs/scale.md): BERT-Large, GPT-2 medium (24 × 1024) and a small LLaMA
  (RMSNorm, RoPE, SwiGLU, grouped-query attention: 4 key/value heads for 16 query heads).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("UNITY_EQ_BENCH_CACHE", ROOT / "benchmarks" / ".cache"))


@dataclass(frozen=True)
class BenchModel:
    name: str
    family: str  # example | cnn | transformer
    make: Callable[[Path], Path]
    layers: int = 0

    def path(self) -> Path:
        CACHE.mkdir(parents=True, exist_ok=True)
        return self.make(CACHE)


def _example(name: str) -> Callable[[Path], Path]:
    return lambda _cache: ROOT / "examples" / f"{name}.onnx"


def _light(stem: str) -> Callable[[Path], Path]:
    def make(cache: Path) -> Path:
        sys.path.insert(0, str(ROOT / "tests"))
        from model_zoo import light_model_paths, randomized_light_model

        out = cache / f"{stem}.onnx"
        if not out.exists():
            source = next(p for p in light_model_paths() if p.stem == stem)
            made = randomized_light_model(source, cache)
            if made != out:
                made.rename(out)
        return out

    return make


@contextlib.contextmanager
def _quiet():  # type: ignore[no-untyped-def]
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    out, err = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
    with warnings.catch_warnings(), out, err:
        warnings.simplefilter("ignore")
        yield


def _hf_model(kind: str, layers: int, hidden: int, heads: int, seq: int) -> tuple[Any, Any, dict[str, Any]]:
    """A transformers model with random weights from a config, its config and its export keyword arguments."""
    import transformers

    if kind == "bert":
        bert = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden
        )
        return transformers.BertModel(bert).eval(), bert, {}
    if kind == "gpt2":
        gpt2 = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq)
        return transformers.GPT2Model(gpt2).eval(), gpt2, {"use_cache": False}
    if kind == "llama":
        llama = transformers.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4),
            intermediate_size=hidden * 8 // 3 // 64 * 64,
            vocab_size=32000,
            max_position_embeddings=max(seq, 2048),
        )
        return transformers.LlamaModel(llama).eval(), llama, {"use_cache": False}
    raise ValueError(f"unknown transformers model kind {kind!r}")


def _hf(
    kind: str, layers: int, hidden: int, heads: int, batch: int = 8, seq: int = 128, mask: bool = False
) -> Callable[[Path], Path]:
    """``mask``: export with an ``attention_mask`` input (all ones at export), as released models are."""

    def make(cache: Path) -> Path:
        out = cache / f"{kind}_{layers}x{hidden}{'_mask' if mask else ''}.onnx"
        if out.exists():
            return out
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        torch.manual_seed(0)
        model, config, kwargs = _hf_model(kind, layers, hidden, heads, seq)
        ids = torch.randint(0, config.vocab_size, (batch, seq))
        if mask:
            kwargs = {**kwargs, "attention_mask": torch.ones(batch, seq, dtype=torch.int64)}
        with _quiet(), torch.no_grad():
            program = torch.onnx.export(model, (ids,), kwargs=kwargs, dynamo=True, external_data=True)
            program.save(str(out), external_data=True)
        return out

    return make


MODELS: dict[str, BenchModel] = {
    "mlp": BenchModel("mlp", "example", _example("mlp")),
    "transformer": BenchModel("transformer", "example", _example("transformer"), 1),
    **{
        stem.removeprefix("light_"): BenchModel(stem.removeprefix("light_"), "cnn", _light(stem))
        for stem in [
            "light_bvlc_alexnet",
            "light_densenet121",
            "light_inception_v1",
            "light_inception_v2",
            "light_resnet50",
            "light_shufflenet",
            "light_squeezenet",
            "light_vgg19",
            "light_zfnet512",
        ]
    },
    "bert-base": BenchModel("bert-base", "transformer", _hf("bert", 12, 768, 12), 12),
    "bert-large": BenchModel("bert-large", "transformer", _hf("bert", 24, 1024, 16), 24),
    "gpt2-xl-depth": BenchModel("gpt2-xl-depth", "transformer", _hf("gpt2", 48, 1600, 25), 48),
    "bert-large-mask": BenchModel("bert-large-mask", "transformer", _hf("bert", 24, 1024, 16, mask=True), 24),
    "gpt2-medium": BenchModel("gpt2-medium", "transformer", _hf("gpt2", 24, 1024, 16, mask=True), 24),
    "llama-small": BenchModel("llama-small", "transformer", _hf("llama", 8, 1024, 16, mask=True), 8),
}


def layer_sweep_model(layers: int) -> Path:
    """BERT with hidden 768 (12 heads) and ``layers`` layers: the depth sweep of the ``layers`` suite."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return _hf("bert", layers, 768, 12)(CACHE)


SUITES = {
    "core": [
        "mlp",
        "transformer",
        "bvlc_alexnet",
        "densenet121",
        "inception_v1",
        "inception_v2",
        "resnet50",
        "shufflenet",
        "squeezenet",
        "vgg19",
        "zfnet512",
    ],
    "scale": ["bert-base", "bert-large", "gpt2-xl-depth", "megatron-layer"],
    "hf": ["bert-large-mask", "gpt2-medium", "llama-small"],
}
SUITES["all"] = SUITES["core"] + SUITES["scale"]
