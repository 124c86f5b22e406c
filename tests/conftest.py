"""Shared fixtures: example models, randomized light models (made once per session), a CLI runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_zoo import light_model_paths, randomized_light_model  # noqa: E402


@pytest.fixture(scope="session")
def examples() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def light_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every onnx light model with its ConstantOfShape weights replaced by random ones (made lazily)."""
    out = tmp_path_factory.mktemp("light")
    return _LazyModels(out)


class _LazyModels(dict):  # type: ignore[type-arg]
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out
        self.paths = {p.stem: p for p in light_model_paths()}

    def __missing__(self, name: str) -> Path:
        path = randomized_light_model(self.paths[name], self.out)
        self[name] = path
        return path


def _console_script() -> str:
    """The `unity-eq` installed beside the interpreter running the tests (not whichever is first on PATH)."""
    beside = Path(sys.executable).parent / "unity-eq"
    return str(beside) if beside.exists() else "unity-eq"


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run the installed console script as a user would."""
    return subprocess.run(
        [_console_script(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )
