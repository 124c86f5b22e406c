"""Shared fixtures: example models, randomized light models (made once per session), a CLI runner; how the
default run is spread over two pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml; ``-n 0``
runs in one process)."""

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


def torchrun(n: int) -> list[str]:
    """The command that starts ``n`` ranks under torchrun. ``--standalone``: its rendezvous on a free port of
    this host, where torchrun's default (master port 29500) let two tests running at once on the two xdist
    workers share one store: a rank of one then aborted at exit ("terminate called without an active
    exception", seen in a full run, never alone)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n)]


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run the installed console script as a user would."""
    return subprocess.run(
        [_console_script(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )


# Modules whose tests are independent and share no module- or session-scoped fixture worth making twice: each of
# their tests is scheduled on its own, so the two workers balance on them at the end of the run. Every other
# module is one xdist group (one worker runs it whole): its module-scoped fixtures (exported models, optimized
# plans, saturated e-graphs) are built once, not once per worker, and the modules that start `mpiexec` or send
# signals to process groups never overlap with themselves.
SPLIT_MODULES = frozenset(
    {
        "test_verify.py",
        "test_verify_differential.py",
        "test_verify_mutants.py",
        "test_adversary_corpus.py",
        "test_activation_memory.py",
    }
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist's ``loadgroup``, put every test of a module outside SPLIT_MODULES in one group."""
    for item in items:
        if item.path.name not in SPLIT_MODULES and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
