"""The edges of the command line (issue 14): usage errors, huge device counts, output paths checked before the
work, a plan folder that holds a user's files, SIGTERM/SIGINT/SIGKILL at any moment, and small bad inputs.

Every CLI test runs the installed console script in a real subprocess; signals are real signals."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, _console_script, run_cli

from unity_eq.errors import OptionError, PlanError
from unity_eq.ir import Mesh
from unity_eq.machine import GroupTopology, LinkSpec, Machine, default_machine


def _one_error(proc: subprocess.CompletedProcess[str], *needles: str, code: int = 2, stdout: bool = False) -> str:
    """The one ``error:`` line (on stderr; `verify` reports on stdout) with every needle, and the exit code."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [line for line in (proc.stdout if stdout else proc.stderr).splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------------------------------------
# Usage errors


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["optimize", "examples/mlp.onnx", "--devces", "3"], "No such option: --devces"),
        (["optimize", "examples/mlp.onnx", "--devices", "abc"], "--devices"),
        (["frob"], "No such command 'frob'"),
        (["optimize"], "Missing argument"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], needle: str) -> None:
    proc = run_cli(*argv, cwd=ROOT)
    line = _one_error(proc, needle)
    assert "--help" in line
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_no_arguments_shows_the_help_and_exits_2() -> None:
    proc = run_cli()
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "optimize" in proc.stdout + proc.stderr


def test_version() -> None:
    from importlib.metadata import version

    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"unity-eq {version('unity-eq')}"


def test_usage_error_class_is_the_one_typer_raises() -> None:
    """The cause of the tracebacks: typer ≥ 0.25 raises its own click's exceptions."""
    import typer

    from unity_eq.cli.dispatch import CLICK_ERROR

    assert issubclass(typer.BadParameter, CLICK_ERROR)


# ----------------------------------------------------------------------------------------------------------
# Huge device counts


def test_device_count_beyond_the_bound_is_an_error_at_once(examples: Path) -> None:
    from unity_eq import optimize
    from unity_eq.machine import MAX_DEVICES, load_machine

    for devices in (1_000_000, MAX_DEVICES + 1):
        start = time.perf_counter()
        with pytest.raises(OptionError, match=rf"at most {MAX_DEVICES} devices, got {devices}"):
            optimize(examples / "mlp.onnx", devices=devices)
        assert time.perf_counter() - start < 0.5
    start = time.perf_counter()
    with pytest.raises(OptionError, match="at most"):
        load_machine("h100x8", nodes=20_000)
    assert time.perf_counter() - start < 0.5
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "--devices", "1000000")
    _one_error(proc, "--devices", "1000000")


@pytest.mark.parametrize("devices", [1024, 100_000])
def test_mesh_enumeration_is_fast_at_100k_devices(examples: Path, devices: int) -> None:
    """Every factorization of 100 000 devices into 1-3 axes (371 meshes) laid on the machine, priced and
    pruned, in about a second (it was a pure-Python loop over every rank of every group: hours)."""
    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.search import candidate_meshes

    graph = load_onnx(examples / "mlp.onnx")
    machine = default_machine(devices)
    start = time.perf_counter()
    trials = candidate_meshes(machine, graph)
    seconds = time.perf_counter() - start
    assert seconds < (0.5 if devices <= 1024 else 5.0), seconds
    assert trials[0].mesh.sizes == (devices,)
    assert trials[0].status == "pending"  # the 1-axis mesh is always tried


def test_mesh_enumeration_of_many_nodes_is_fast(examples: Path) -> None:
    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.machine import load_machine
    from unity_eq.search import candidate_meshes

    machine = load_machine("h100x8", nodes=8192)  # 65 536 devices in 8192 nodes
    start = time.perf_counter()
    trials = candidate_meshes(machine, load_onnx(examples / "mlp.onnx"))
    assert time.perf_counter() - start < 5.0
    first = trials[0].axes[0]
    assert first.spans_nodes and first.nodes == 8192 and first.ranks_per_node == 8


def _reference_topologies(machine: Machine, mesh: Mesh, axis: str) -> tuple[GroupTopology, ...]:
    """The definition, group by group and rank by rank (the code before issue 14)."""
    i = mesh.axes.index(axis)
    per_node = Counter(machine.node_of[d] for d in mesh.devices)
    found: dict[GroupTopology, None] = {}
    for rank in range(mesh.size):
        coords = list(mesh.coords(rank))
        if coords[i] != 0:
            continue
        group = []
        for c in range(mesh.sizes[i]):
            coords[i] = c
            group.append(mesh.rank_of(tuple(coords)))
        nodes = Counter(machine.node_of[mesh.devices[r]] for r in group)
        k, m = max(nodes.values()), len(nodes)
        local = None
        if k > 1:
            links = [machine.node(n).link for n, c in nodes.items() if c > 1]
            names = "/".join(sorted({link.name for link in links if link.name}))
            local = LinkSpec(min(x.bandwidth for x in links), max(x.latency for x in links), names)
        network = None
        if m > 1:
            shares = []
            for n in nodes:
                spec = machine.node(n)
                assert spec.network is not None
                shares.append(
                    LinkSpec(spec.nics * spec.network.bandwidth / per_node[n], spec.network.latency, spec.network.name)
                )
            names = "/".join(sorted({s.name for s in shares if s.name}))
            network = LinkSpec(min(s.bandwidth for s in shares), max(s.latency for s in shares), names)
        found.setdefault(GroupTopology(len(group), k, m, local, network), None)
    return tuple(found)


def _machines() -> list[Machine]:
    from unity_eq.machine import load_machine

    machines = [default_machine(n) for n in (1, 6, 12)]
    machines += [load_machine("h100x8", nodes=2), load_machine("pcie-a100x8", nodes=3)]
    machines += [load_machine(ROOT / "examples" / "machines" / name) for name in ("mixed.toml", "dgx-h100x2.toml")]
    return machines


@pytest.mark.parametrize("mask_kinds", [62, 0], ids=["bit-masks", "python"])
def test_group_topologies_match_the_definition(mask_kinds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both paths of the vectorized grouping give exactly (bit for bit, in order) what the definition gives,
    for meshes in machine order and in shuffled device orders, on uniform and mixed machines."""
    import unity_eq.cost as cost
    import unity_eq.cost.topology as topology
    from unity_eq.search.meshes import _factorizations

    monkeypatch.setattr(topology, "MASK_KINDS", mask_kinds)
    rng = random.Random(14)
    checked = 0
    for machine in _machines():
        n = machine.device_count
        for sizes in _factorizations(n, 3):
            orders = [None, rng.sample(range(n), n)]
            for order in orders:
                mesh = Mesh(("x", "y", "z")[: len(sizes)], sizes, tuple(order) if order else ())
                model = cost.CostModel(machine, mesh)
                for axis in mesh.axes:
                    assert model.group_topologies(axis) == _reference_topologies(machine, mesh, axis)
                    checked += 1
    assert checked > 100


def test_mesh_groups_match_the_definition() -> None:
    for sizes in [(4,), (2, 3), (3, 2, 4), (1, 5, 2), (6, 1)]:
        mesh = Mesh(("x", "y", "z")[: len(sizes)], sizes)
        for axis in mesh.axes:
            i = mesh.axes.index(axis)
            expected: dict[tuple[int, ...], None] = {}
            for rank in range(mesh.size):
                coords = mesh.coords(rank)
                expected.setdefault(
                    tuple(mesh.rank_of((*coords[:i], c, *coords[i + 1 :])) for c in range(sizes[i])), None
                )
            assert mesh.groups(axis) == list(expected)
            for rank in range(mesh.size):
                assert mesh.group(rank, axis) in expected


def test_factorizations_match_the_definition() -> None:
    from unity_eq.search.meshes import _factorizations

    def brute(n: int, most: int) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for k in range(1, most + 1):

            def rec(rest: int, prefix: tuple[int, ...], k: int = k) -> None:
                if len(prefix) == k:
                    if rest == 1:
                        out.append(prefix)
                    return
                for f in range(2, rest + 1):
                    if rest % f == 0:
                        rec(rest // f, (*prefix, f))

            rec(n, ())
        return sorted(out, key=lambda s: (len(s), s))

    for n in range(1, 130):
        for most in (1, 2, 3):
            assert _factorizations(n, most) == (brute(n, most) if n > 1 else [(1,)])


# ----------------------------------------------------------------------------------------------------------
# Output paths are checked before the work


@pytest.mark.parametrize("target", ["/proc/unity-eq-plan", "FILE/sub"])
def test_unwritable_plan_folder_is_refused_before_the_search(examples: Path, tmp_path: Path, target: str) -> None:
    (tmp_path / "FILE").write_text("a file")
    path = target.replace("FILE", str(tmp_path / "FILE"))
    proc = run_cli("optimize", str(examples / "transformer.onnx"), "--devices", "4", "-o", path)
    _one_error(proc, "`-o`")
    assert "saturating" not in proc.stderr and "loading" not in proc.stderr


def test_unwritable_file_outputs_are_refused_before_the_work(examples: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    proc = run_cli("verify", "--json", "/proc/unity-eq.json")
    _one_error(proc, "`--json`", "/proc")
    assert "proven" not in proc.stdout  # refused before the proofs
    assert time.monotonic() - start < 20
    (tmp_path / "FILE").write_text("a file")
    _one_error(run_cli("run", str(tmp_path / "no-plan"), "--outputs", str(tmp_path / "FILE" / "o.npz")), "`--outputs`")
    _one_error(run_cli("profile", str(examples / "mlp.onnx"), "-n", "2", "-o", "/proc/p.json"), "`-o`", "/proc")


# ----------------------------------------------------------------------------------------------------------
# A plan folder with a user's files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_reoptimizing_keeps_the_users_files_and_permissions(examples: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    args = ["optimize", str(examples / "mlp.onnx"), "-q", "-o", str(plan)]
    assert run_cli(*args, "--devices", "4").returncode == 0
    (plan / "notes.txt").write_text("mine")
    (plan / "runs").mkdir()
    (plan / "runs" / "out.npz").write_bytes(b"outputs")
    plan.chmod(0o750)
    proc = run_cli(*args, "--devices", "2")
    assert proc.returncode == 0, proc.stderr
    assert (plan / "notes.txt").read_text() == "mine"
    assert (plan / "runs" / "out.npz").read_bytes() == b"outputs"
    assert sorted(p.name for p in plan.glob("device_*")) == ["device_0.onnx", "device_1.onnx"]  # old ranks gone
    assert json.loads((plan / "plan.json").read_text())["mesh"]["sizes"] == [2]
    assert plan.stat().st_mode & 0o777 == 0o750
    for path in plan.glob("device_*"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]  # no temporary or backup folder left


def test_reoptimizing_into_the_current_folder_or_through_a_link(examples: Path, tmp_path: Path) -> None:
    """`-o .` from inside the plan folder once built its temporary plan inside the folder and copied it into
    itself until the name was too long (a traceback); a link to a plan folder is written through."""
    plan = tmp_path / "plan"
    model = str(examples / "mlp.onnx")
    assert run_cli("optimize", model, "-q", "--devices", "4", "-o", str(plan)).returncode == 0
    (plan / "notes.txt").write_text("mine")
    proc = run_cli("optimize", model, "-q", "--devices", "2", "-o", ".", cwd=plan)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((plan / "plan.json").read_text())["mesh"]["sizes"] == [2]
    assert (plan / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temporary or backup folder left

    link = tmp_path / "latest"
    link.symlink_to(plan, target_is_directory=True)
    proc = run_cli("optimize", model, "-q", "--devices", "4", "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and len(list(plan.glob("device_*.onnx"))) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "plan"]


def test_new_plan_folder_gets_the_umask_permissions(tmp_path: Path) -> None:
    """onnx writes external data 0600 and mkdtemp makes 0700: the plan gets what the umask gives."""
    from unity_eq.files import plan_tempdir, replace_plan_files

    target = tmp_path / "plan"
    with plan_tempdir(target) as new:
        (new / "plan.json").write_text("{}")
        (new / "device_0.onnx.data").write_bytes(b"w")
        (new / "device_0.onnx.data").chmod(0o600)
        replace_plan_files(new, target)
    assert target.stat().st_mode & 0o777 == 0o777 & ~_umask()
    assert (target / "device_0.onnx.data").stat().st_mode & 0o777 == 0o666 & ~_umask()


# ----------------------------------------------------------------------------------------------------------
# Signals


def _start(args: list[str], tmpdir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, TMPDIR=str(tmpdir))
    return subprocess.Popen(
        [_console_script(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait_for(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        if text in line:
            return
    raise AssertionError(f"{text!r} never came; exit {proc.wait()}")


def _engines(tmpdir: Path) -> list[int]:
    """Live engine workers whose job folder is under ``tmpdir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "unity_eq.egraph" in cmdline and str(tmpdir) in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_the_search_cleans_up_and_says_so(examples: Path, tmp_path: Path, signum: int, code: int) -> None:
    jobs = tmp_path / "tmp"
    jobs.mkdir()
    proc = _start(["optimize", str(examples / "transformer.onnx"), "-n", "16", "-o", str(tmp_path / "p")], jobs)
    _wait_for(proc, "saturating")
    time.sleep(0.3)
    assert list(jobs.glob("unity-eq-*")), "no engine job folder while saturating"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(said) == 1 and signal.Signals(signum).name in said[0] and "optimize" in said[0], err
    assert list(jobs.iterdir()) == []
    assert _engines(jobs) == []
    assert not (tmp_path / "p").exists()


def test_sigkill_leaves_folders_that_the_next_run_sweeps(examples: Path, tmp_path: Path) -> None:
    jobs = tmp_path / "tmp"
    jobs.mkdir()
    proc = _start(["optimize", str(examples / "transformer.onnx"), "-n", "16", "-o", str(tmp_path / "p")], jobs)
    _wait_for(proc, "saturating")
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=30)
    left = list(jobs.glob("unity-eq-*"))
    assert left  # SIGKILL cannot be caught: the job folders stay…
    deadline = time.monotonic() + 10
    while _engines(jobs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _engines(jobs) == []  # …but the engines die with their parent
    again = _start(["optimize", str(examples / "mlp.onnx"), "-n", "2", "-q", "-o", str(tmp_path / "q")], jobs)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    # …and the next run sweeps those of the dead run (a dependency may leave its own session-id file there)
    assert [p for p in jobs.iterdir() if "unity-eq" in p.name] == []


def test_sigterm_while_writing_leaves_no_temporary_plan(examples: Path, tmp_path: Path) -> None:
    target = tmp_path / "plan"
    proc = _start(["optimize", str(examples / "mlp.onnx"), "-n", "64", "--max-axes", "1", "-o", str(target)], tmp_path)
    _wait_for(proc, "lowering")
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".plan.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert list(tmp_path.glob(".plan.tmp-*")), "the plan was never being written"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM" in err
    assert [p.name for p in tmp_path.iterdir()] == []  # neither the hidden temporary plan nor a half plan


@pytest.fixture(scope="module")
def big_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 128 MiB MLP and its 4-rank plan: `check` and `run` take a good part of a second on it."""
    from big_models import write_external_mlp

    root = tmp_path_factory.mktemp("big")
    model = write_external_mlp(root / "model", hidden=1024, ffn=8192, pairs=2).path
    plan = root / "plan"
    made = run_cli("optimize", str(model), "-n", "4", "-q", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    return model, plan


@pytest.mark.parametrize("verb", ["check", "run"])
def test_sigterm_during_run_and_check_ends_at_once(big_plan: tuple[Path, Path], tmp_path: Path, verb: str) -> None:
    """A signal between the start of two rank threads left the started ones waiting 300 s in a collective for
    the others (and the interpreter's exit waiting for them). Signals at many moments of the run: every one
    ends the process within a few seconds, with one line and exit 143 (SIGTERM) or 130 (SIGINT), and leaves no
    file behind."""
    model, plan = big_plan
    jobs = tmp_path / "tmp"
    jobs.mkdir()
    out = tmp_path / "out.npz"
    args = ["check", str(model), str(plan)] if verb == "check" else ["run", str(plan), "--outputs", str(out)]
    marker = "checking on" if verb == "check" else "no --inputs"  # the ranks start right after
    interrupted = 0
    for i, delay in enumerate((0.0, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3)):
        signum = signal.SIGINT if i % 3 == 2 else signal.SIGTERM
        out.unlink(missing_ok=True)
        proc = _start(args, jobs)
        _wait_for(proc, marker)
        time.sleep(delay)
        proc.send_signal(signum)
        start = time.monotonic()
        try:
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert time.monotonic() - start < 5, f"{verb} took {time.monotonic() - start:.1f} s to stop"
        assert "Traceback" not in err and "error:" not in err, err
        said = [line for line in err.splitlines() if line.startswith("interrupted")]
        if proc.returncode == 0:  # done before the signal came
            assert said == [], err
            continue
        assert proc.returncode == 128 + signum, err
        assert len(said) == 1 and f"interrupted by {signum.name}: unity-eq {verb}" in said[0], err
        assert [p.name for p in jobs.iterdir() if "unity-eq" in p.name] == []  # (a dependency writes .ses)
        assert [p.name for p in tmp_path.iterdir() if p.name != "tmp"] == []  # no (partial) outputs
        interrupted += 1
    assert interrupted >= 3, "the signals came too late to interrupt anything"


def test_an_interrupt_ends_a_collective_wait_at_once() -> None:
    """The in-process board: a rank waiting for another (that never comes) stops within its poll interval
    once SIGTERM asked the process to stop, instead of waiting out the collective timeout."""
    script = """
import os, signal, threading, time
import numpy as np
from unity_eq.files import Interrupted, install_signal_handlers
from unity_eq.runtime import Board
install_signal_handlers()
board = Board(2, timeout=300.0)
said = []
def rank0():
    try:
        board.exchange(0, (0, 1), np.zeros(3))
    except Exception as exc:
        said.append(str(exc))
thread = threading.Thread(target=rank0)
thread.start()
time.sleep(0.3)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except Interrupted:
    start = time.monotonic()
    thread.join(5)
    print(f"{not thread.is_alive()} {time.monotonic() - start:.2f} {said}")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    ended, seconds, message = proc.stdout.split(" ", 2)
    assert ended == "True" and float(seconds) < 1.0, proc.stdout
    assert "rank 0 stopped because the run was interrupted" in message, proc.stdout


def _session_processes(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid:
                pids.append(int(entry.name))
    return pids


def test_sigterm_stops_verify_and_its_worker_processes() -> None:
    """`with ProcessPoolExecutor` waits for all queued proofs: an interrupt must kill the workers instead."""
    proc = subprocess.Popen(
        [_console_script(), "verify", "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # wait until the workers are proving (all rules take minutes): loading the rules takes seconds, more
        # on a loaded machine, so poll instead of sleeping a fixed time
        deadline = time.monotonic() + 90
        while len(_session_processes(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert len(_session_processes(proc.pid)) >= 2
        time.sleep(1)  # the workers have started proving
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10
        assert proc.returncode == 143, err
        assert "Traceback" not in err and "interrupted by SIGTERM: unity-eq verify" in err
        time.sleep(0.5)
        assert _session_processes(proc.pid) == []
    finally:
        if proc.poll() is None or _session_processes(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_stale_folders_of_live_runs_are_kept(tmp_path: Path) -> None:
    from unity_eq.files import owner_tag, sweep_stale

    mine = tmp_path / f"unity-eq-{owner_tag()}abc"
    dead_pid = 2**22 + 12345  # above pid_max's default: never a live process
    dead = tmp_path / f"unity-eq-{owner_tag(dead_pid)}abc"
    other = tmp_path / "unity-eq-abcdefgh"  # no owner recorded: not ours to judge
    for path in (mine, dead, other):
        path.mkdir()
    assert sweep_stale(tmp_path, "unity-eq-") == [dead]
    assert mine.exists() and other.exists() and not dead.exists()


# ----------------------------------------------------------------------------------------------------------
# Small bad inputs


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = tmp_path_factory.mktemp("hardening") / "plan"
    assert run_cli("optimize", str(ROOT / "examples" / "mlp.onnx"), "-n", "2", "-q", "-o", str(plan)).returncode == 0
    return plan


def test_npy_inputs_are_an_error(examples: Path, mlp_plan: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((8, 128, 256), np.float32))
    for verb in (["check", str(examples / "mlp.onnx")], ["run"]):
        _one_error(run_cli(*verb, str(mlp_plan), "--inputs", str(tmp_path / "x.npy")), "x.npy", ".npz")


def test_check_option_values(examples: Path, mlp_plan: Path) -> None:
    _one_error(run_cli("check", str(examples / "mlp.onnx"), str(mlp_plan), "--tolerance", "-1"), "`--tolerance`")


def test_optimize_option_values(examples: Path) -> None:
    mlp = str(examples / "mlp.onnx")
    _one_error(run_cli("optimize", mlp, "-n", "2", "--memory-limit", "0"), "`--memory-limit`")
    line = _one_error(run_cli("optimize", mlp, "-n", "2", "--input-shape", "X=8x64x256"), "'X'", "dim 1", "128")
    assert "static" in line
    _one_error(
        run_cli("optimize", mlp, "-n", "2", "--input-shape", "X=8x128x256", "--input-shape", "X=4x128x256"),
        "'X'",
        "twice",
    )


def test_verify_of_a_file_without_rules(tmp_path: Path) -> None:
    empty = tmp_path / "empty.egg"
    empty.write_text("; only a comment\n")
    proc = run_cli("verify", str(empty))
    _one_error(proc, "nothing to verify", "empty.egg", stdout=True)
    assert "ok" not in proc.stdout.split()


def test_bad_rule_file_is_reported_once_before_the_search(examples: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.egg"
    bad.write_text('(rewrite (Relu ?x) (Relu ?y) :ruleset parallel :name "unbound")\n')
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "-n", "4", "--rules", str(bad), "-o", str(tmp_path / "p"))
    line = _one_error(proc, "bad.egg:1", "unbound var ?y")
    assert "saturating" not in proc.stderr
    assert line == _one_error(run_cli("verify", str(bad)), "bad.egg:1", stdout=True)  # the same as verify's
    bad.write_text("(rewrite (Relu ?x)\n")
    _one_error(run_cli("optimize", str(examples / "mlp.onnx"), "-n", "4", "--rules", str(bad)), "bad.egg:1:1:")


@pytest.mark.parametrize(
    ("text", "where", "needle"),
    [
        ("; a comment\n\n  (frobnicate 1 2)\n", "bad.egg:3:3:", "unknown command 'frobnicate'"),
        ("(sort Foo)\n(sort Foo)\n", "bad.egg:2:1:", "Sort Foo already declared"),
        ("(sort T)\n", "bad.egg:1:1:", "Sort T already declared"),  # a sort of the shipped schema
        (  # only egglog's type checker sees this one
            '(function f (T) i64 :merge (max old new))\n(rule ((= x (Relu y))) ((set (f x) "s")) :ruleset analysis)\n',
            "bad.egg:2:36:",
            'Expect expression "s" to have type i64',
        ),
    ],
    ids=["unknown-command", "duplicate-sort", "schema-sort-again", "egglog-type-error"],
)
def test_rule_file_egglog_rejects_is_one_line_before_the_search_and_in_verify(
    examples: Path, tmp_path: Path, text: str, where: str, needle: str
) -> None:
    bad = tmp_path / "bad.egg"
    bad.write_text(text)
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "-n", "4", "--rules", str(bad), "-o", str(tmp_path / "p"))
    line = _one_error(proc, where, needle)
    assert "saturating" not in proc.stderr and "no mesh produced a plan" not in proc.stderr
    assert not (tmp_path / "p").exists()
    assert line == _one_error(run_cli("verify", str(bad)), where, needle, stdout=True)


def test_sound_rule_file_still_loads_in_optimize_and_verify(examples: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.egg"
    good.write_text('; fine\n(rewrite (Relu (Identity ?x)) (Relu ?x) :ruleset algebra :name "drop-identity")\n')
    verify = run_cli("verify", str(good))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "1 proven" in verify.stdout
    rules = [arg for p in [*sorted((ROOT / "rules" / "parallel").glob("*.egg")), good] for arg in ("--rules", str(p))]
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "-n", "2", *rules, "-o", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p" / "plan.json").exists()


def test_plan_file_errors_are_the_same_for_run_and_explain(mlp_plan: Path, tmp_path: Path) -> None:
    import shutil

    from unity_eq.explain import explain
    from unity_eq.runtime import load_plan_dir

    plan = tmp_path / "plan"
    shutil.copytree(mlp_plan, plan)
    meta = json.loads((plan / "plan.json").read_text())
    for change, needle in [
        ({"files": meta["files"][:1]}, "field 'files': expected 2 file names"),
        ({"files": ["device_0.onnx", "../../etc/passwd"]}, "files[1]"),
        ({"format_version": 99}, "plan format version 99"),
    ]:
        (plan / "plan.json").write_text(json.dumps({**meta, **change}))
        for read in (load_plan_dir, explain):
            with pytest.raises(PlanError, match=re.escape(needle)):
                read(plan)
        _one_error(run_cli("run", str(plan)), needle)
        _one_error(run_cli("explain", str(plan)), needle)


# ----------------------------------------------------------------------------------------------------------
# Set-up


def test_readme_starts_with_the_main_job_and_links_only_inside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None
    first, second = block.group(1).strip().splitlines()[:2]
    assert first.startswith("pip install -e . &&") and "unity-eq optimize" in first and "unity-eq check" in first
    assert "[test]" in second and "pytest" in second
    for target in re.findall(r"\]\(([^)#]+)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        resolved = (ROOT / target).resolve()
        assert resolved.is_relative_to(ROOT), target
        assert resolved.exists(), target


def test_extras_split_main_test_and_dev() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    main = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for heavy in ("torch", "transformers", "pytest", "mypy"):
        assert heavy not in main
    assert any(dep.startswith("pytest") for dep in extras["test"])
    assert any(dep.startswith("torch") for dep in extras["test"])
    assert "unity-eq[test]" in extras["dev"] and any(dep.startswith("mypy") for dep in extras["dev"])


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("signals and /proc as on Linux")


def test_machine_order_is_one_tuple_per_size() -> None:
    """The cost model and the topology cache recognise the search's meshes by the identity of this tuple
    (unity_eq/cost/topology.py): a fresh tuple per call makes every 100k-device mesh take the slow path."""
    from unity_eq.ir import machine_order

    assert machine_order(100_000) is machine_order(100_000)


_IGNORED_SIGNAL = """
import signal, sys, weakref
from unity_eq.files import Interrupted, install_signal_handlers
install_signal_handlers()
class Held:
    pass
held = Held()
def callback(_ref):  # the handler raising inside a callback whose exceptions Python can only print
    raise Interrupted(signal.SIGTERM)
ref = weakref.ref(held, callback)
try:
    del held
    import time
    time.sleep(5)  # the signal sent again arrives within this
except Interrupted as exc:
    print("interrupted", exc.signum)
else:
    print("lost")
"""


def test_a_signal_raised_where_python_only_prints_it_is_raised_again() -> None:
    """A SIGTERM that arrives inside a weakref callback of the import system (seen in CI as "Exception
    ignored in: <function _get_module_lock.<locals>.cb>" and a traceback, the interrupt lost) is raised
    again where it propagates, with nothing printed."""
    result = subprocess.run([sys.executable, "-c", _IGNORED_SIGNAL], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == f"interrupted {int(signal.SIGTERM)}", result.stdout + result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr
