"""The ONNX frontend on real models (bundled examples, onnx's model-zoo CNNs, a PyTorch export) and on small
models written in ONNX's text format for each rule: errors, input shapes, folding, canonical forms.

Numerical checks rebuild an ONNX model from the Graph and compare it with the original in onnxruntime, which
catches a wrong fold or rewrite; they run only on small models to keep the file fast.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from model_zoo import export_torch_transformer, light_model_paths, randomized_light_model
from onnx import helper, numpy_helper

from unity_eq.errors import DynamicShapeError, ModelError, OptionError
from unity_eq.frontends.onnx import load_onnx, parse_input_shape
from unity_eq.ir import Graph

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FOLDED_OPS = {"Constant", "ConstantOfShape", "Shape", "Size", "Sum", "Dropout"}


# ------------------------------------------------------------------------------------------ helpers


def write_model(tmp_path: Path, text: str, name: str = "model.onnx") -> Path:
    """Save a model written in ONNX's text format, without checking it (some tests want it invalid)."""
    path = tmp_path / name
    onnx.save(onnx.parser.parse_model(text), path)
    return path


def graph_to_model(graph: Graph) -> onnx.ModelProto:
    """The Graph as an ONNX model again, to run it in onnxruntime."""

    def value_info(name: str) -> onnx.ValueInfoProto:
        t = graph.types[name]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), t.shape)

    nodes = [
        helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain, **n.attrs) for n in graph.nodes
    ]
    inits = [numpy_helper.from_array(a, name) for name, a in graph.initializers.items()]
    body = helper.make_graph(
        nodes,
        graph.name,
        [value_info(n) for n in graph.inputs],
        [value_info(n) for n in graph.outputs],
        inits,
    )
    opsets = [helper.make_opsetid("", graph.opset)] + [helper.make_opsetid(d, v) for d, v in graph.extra_opsets.items()]
    model = helper.make_model(body, opset_imports=opsets, ir_version=graph.ir_version)
    onnx.checker.check_model(model)
    return model


def assert_same_outputs(original: Path, graph: Graph) -> None:
    """The loaded Graph computes what the original model computes, on random inputs."""
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(t.shape).astype(t.dtype) for name, t in graph.inputs.items()}
    providers = ["CPUExecutionProvider"]
    expected = ort.InferenceSession(str(original), providers=providers).run(None, feeds)
    got = ort.InferenceSession(graph_to_model(graph).SerializeToString(), providers=providers).run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        assert np.isfinite(e).all()
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def assert_well_formed(graph: Graph) -> None:
    """The Graph invariants: static types everywhere, topological order, unique names, folded constants."""
    names = [n.name for n in graph.nodes]
    assert all(names) and len(set(names)) == len(names)
    assert not set(graph.inputs) & set(graph.initializers)
    defined = set(graph.inputs) | set(graph.initializers)
    for node in graph.nodes:
        assert node.op_type not in FOLDED_OPS, node
        for name in node.inputs:
            assert not name or name in defined, f"{node.name} reads {name} before it is defined"
        defined.update(o for o in node.outputs if o)
    assert set(graph.outputs) <= defined
    for name in defined | set(graph.outputs):
        t = graph.types[name]
        assert all(isinstance(d, int) and d >= 0 for d in t.shape), (name, t)
        assert np.dtype(t.dtype)
    for name, array in graph.initializers.items():
        assert graph.types[name].shape == array.shape and graph.types[name].dtype == array.dtype.name


# ------------------------------------------------------------------------------------------ real models


def test_mlp_example_loads() -> None:
    graph = load_onnx(EXAMPLES / "mlp.onnx")
    assert_well_formed(graph)
    assert {n: str(t) for n, t in graph.inputs.items()} == {"X": "float32[8x128x256]"}
    assert graph.outputs == ["Y"] and graph.types["Y"].shape == (8, 128, 256)
    assert [n.op_type for n in graph.nodes] == ["MatMul", "Add", "Relu", "MatMul", "Add"]
    assert graph.types["fc1.weight"].shape == (256, 1024) and graph.opset == 18
    assert graph.source == str(EXAMPLES / "mlp.onnx") and graph.name == "mlp"
    assert_same_outputs(EXAMPLES / "mlp.onnx", graph)


def test_transformer_example_loads() -> None:
    graph = load_onnx(EXAMPLES / "transformer.onnx")
    assert_well_formed(graph)
    assert {n: t.shape for n, t in graph.inputs.items()} == {"X": (8, 128, 256)}
    assert graph.types["attn.scores"].shape == (8, 8, 128, 128)
    assert graph.types["Y"].shape == (8, 128, 256)
    ops = [n.op_type for n in graph.nodes]
    assert ops.count("MatMul") == 8 and ops.count("LayerNormalization") == 2 and ops.count("Erf") == 1
    layer_norm = next(n for n in graph.nodes if n.op_type == "LayerNormalization")
    assert layer_norm.attrs["axis"] == -1 and isinstance(layer_norm.attrs["epsilon"], float)


@pytest.fixture(scope="module")
def light_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("light")


@pytest.mark.parametrize("path", light_model_paths(), ids=lambda p: p.stem)
def test_light_model_loads_with_static_shapes(path: Path, light_dir: Path) -> None:
    randomized = randomized_light_model(path, light_dir)
    graph = load_onnx(randomized)
    assert_well_formed(graph)
    assert [t.shape for t in graph.inputs.values()] == [(1, 3, 224, 224)]  # IR 3 weight inputs are not inputs
    assert graph.opset == 18 and graph.ir_version >= 7
    assert graph.types[graph.outputs[0]].numel == 1000  # (1, 1000), or (1, 1000, 1, 1) for densenet
    if path.stem in ("light_squeezenet", "light_shufflenet", "light_inception_v1"):  # small: compare numbers
        assert_same_outputs(randomized, graph)


def test_light_model_keeps_its_weights_random(light_dir: Path) -> None:
    path = next(p for p in light_model_paths() if p.stem == "light_squeezenet")
    graph = load_onnx(randomized_light_model(path, light_dir / "seeded", seed=3))
    weight = graph.initializers["conv1_w_0"]
    assert weight.shape == (64, 3, 3, 3) and weight.std() > 0.05


def test_torch_export_loads(tmp_path: Path) -> None:
    path = export_torch_transformer(tmp_path / "encoder.onnx")
    graph = load_onnx(path)
    assert_well_formed(graph)
    assert [t.shape for t in graph.inputs.values()] == [(2, 16, 64)]
    assert graph.types[graph.outputs[0]].shape == (2, 16, 64)
    assert graph.opset >= 18
    assert_same_outputs(path, graph)


# ------------------------------------------------------------------------------------------ input shapes

DYNAMIC = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, 16] x) => (float[batch, 4, 4] y) <int64[1] zero = {0}, int64[1] four = {4}> {
    s = Shape(x)
    b = Gather<axis = 0>(s, zero)
    shape = Concat<axis = 0>(b, four, four)
    y = Reshape(x, shape)
}
"""


@pytest.fixture
def dynamic_model(tmp_path: Path) -> Path:
    return write_model(tmp_path, DYNAMIC)


def test_dynamic_input_needs_a_shape(dynamic_model: Path) -> None:
    with pytest.raises(DynamicShapeError, match=r"input 'x' has dynamic dimension 'batch'") as error:
        load_onnx(dynamic_model)
    message = str(error.value)
    assert message.startswith(str(dynamic_model)) and "`--input-shape x=1x16`" in message
    assert "\n" not in message


def test_input_shapes_make_shape_subgraphs_constant(dynamic_model: Path) -> None:
    graph = load_onnx(dynamic_model, {"x": (2, 16)})
    assert_well_formed(graph)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    assert graph.initializers["shape"].tolist() == [2, 4, 4]
    assert graph.types["y"].shape == (2, 4, 4)


@pytest.mark.parametrize(
    ("shapes", "pattern"),
    [
        ({"nope": (2, 16)}, r"no input 'nope'; its inputs are 'x'"),
        ({"x": (2, 16, 1)}, r"rank 2 \(shape \[batch, 16\]\), got 3 dims"),
        ({"x": (0, 16)}, r"positive integer, got \[0, 16\]"),
        ({"x": (-1, 16)}, r"positive integer"),
    ],
    ids=["unknown-name", "wrong-rank", "zero", "negative"],
)
def test_bad_input_shapes(dynamic_model: Path, shapes: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        load_onnx(dynamic_model, shapes)


def test_weight_is_not_an_input(light_dir: Path) -> None:
    path = next(p for p in light_model_paths() if p.stem == "light_squeezenet")
    with pytest.raises(OptionError, match=r"its inputs are 'data_0'"):
        load_onnx(randomized_light_model(path, light_dir / "weights"), {"conv1_w_0": (64, 3, 3, 3)})


def test_input_shape_cannot_change_a_static_dim(tmp_path: Path) -> None:
    """A static dim is part of the model (onnxruntime runs the original with it: `check` would crash), so
    `--input-shape` may only fix dynamic dims; repeating the static value is fine."""
    path = write_model(
        tmp_path,
        '<ir_version: 8, opset_import: ["" : 18]> g (float[1, 16] x) => (float[1, 16] y) { y = Relu(x) }',
    )
    with pytest.raises(OptionError, match=r"input 'x' dim 0 is static \(1\) in the model \(shape \[1, 16\]\), got 4"):
        load_onnx(path, {"x": [4, 16]})
    assert load_onnx(path, {"x": [1, 16]}).types["y"].shape == (1, 16)


def test_parse_input_shape() -> None:
    assert parse_input_shape("x=2x16") == ("x", (2, 16))
    assert parse_input_shape("gpu_0/data_0=1x3x224x224") == ("gpu_0/data_0", (1, 3, 224, 224))
    assert parse_input_shape("ids=7") == ("ids", (7,))


@pytest.mark.parametrize("text", ["x", "x=", "=2x16", "x=2x", "x=2,16", "x=ax16", "x=0x16", "x=-2x16"])
def test_parse_input_shape_rejects_bad_syntax(text: str) -> None:
    with pytest.raises(OptionError, match=r"expected NAME=DIMS"):
        parse_input_shape(text)


# ------------------------------------------------------------------------------------------ bad files


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"missing\.onnx: no such file"):
        load_onnx(tmp_path / "missing.onnx")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"is a directory"):
        load_onnx(tmp_path)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"", r"the file is empty"),
        (np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(), r"not an ONNX model"),
        (b"name,value\nlr,0.1\n# just a text file\n", r"not an ONNX model"),
    ],
    ids=["empty", "random-bytes", "text"],
)
def test_not_onnx(tmp_path: Path, content: bytes, pattern: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=pattern) as error:
        load_onnx(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_model_failing_the_checker(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        '<ir_version: 8, opset_import: ["" : 18]> g (float[2] x) => (float[2] y) { y = Relu(undefined) }',
    )
    with pytest.raises(ModelError, match=r"fails the ONNX checker: .*'undefined'") as error:
        load_onnx(path)
    assert "\n" not in str(error.value)


def test_external_data(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 64])],
        [weight],
    )
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.weights", size_threshold=0)
    np.testing.assert_array_equal(load_onnx(path).initializers["w"], np.eye(64, dtype=np.float32))

    (tmp_path / "ext.weights").unlink()
    graph = load_onnx(path)  # planning needs only dtypes and shapes: the weight stands in, shape-only
    weight = graph.initializers["w"]
    assert (weight.shape, weight.dtype, weight.strides) == ((64, 64), np.float32, (0, 0))
    assert graph.missing_weights == {"w": f"external data file 'ext.weights' not found in '{tmp_path}'"}


def _matmul_model_with_external_weight(folder: Path, location: str) -> Path:
    """A MatMul model whose weight ``w`` is stored at ``location`` (as written in the model, not checked)."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * 4 * 4))):
        weight.external_data.add(key=key, value=value)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [weight],
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(body, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), path)
    return path


@pytest.mark.parametrize("kind", ["relative", "absolute", "symlink", "constant"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path, kind: str) -> None:
    """A model may not make unity-eq read (and copy into a plan) a file outside its folder."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    if kind == "symlink":
        (folder / "w.bin").symlink_to(secret)
        location = "w.bin"
    else:
        location = {"relative": "../../secret.bin", "absolute": str(secret), "constant": "../../secret.bin"}[kind]
    path = _matmul_model_with_external_weight(folder, location)
    if kind == "constant":  # the same location on a Constant node's value instead of an initializer
        model = onnx.load(path, load_external_data=False)
        weight = model.graph.initializer.pop()
        model.graph.node.insert(0, helper.make_node("Constant", [], ["w"], value=weight))
        onnx.save(model, path)
    with pytest.raises(ModelError, match=r"'w' points outside the model's folder") as error:
        load_onnx(path)
    assert "\n" not in str(error.value)


def test_external_data_in_a_subfolder_of_the_model_folder_loads(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.bin").write_bytes(np.eye(4, dtype=np.float32).tobytes())
    path = _matmul_model_with_external_weight(tmp_path, "weights/w.bin")
    np.testing.assert_array_equal(load_onnx(path).initializers["w"], np.eye(4, dtype=np.float32))


def test_old_opset_is_upgraded(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 6, opset_import: ["" : 11]>
        g (float[2, 8] x) => (float[2, 8] y) { y = Softmax<axis = 1>(x) }""",
    )
    graph = load_onnx(path)
    assert graph.opset == 18 and graph.ir_version >= 8
    assert_same_outputs(path, graph)


# ------------------------------------------------------------------------------------------ canonical forms


def test_sum_becomes_a_chain_of_adds(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[4] a, float[4] b, float[4] c, float[2, 4] d) => (float[2, 4] y, float[4] z) {
            y = Sum(a, b, c, d)
            z = Sum(a)
        }""",
    )
    graph = load_onnx(path)
    assert_well_formed(graph)
    assert [(n.op_type, n.outputs[0]) for n in graph.nodes][-1] == ("Identity", "z")
    adds = [n for n in graph.nodes if n.op_type == "Add"]
    assert [n.inputs[1] for n in adds] == ["b", "c", "d"] and adds[-1].outputs == ("y",)
    assert graph.types[adds[0].outputs[0]].shape == (4,) and graph.types["y"].shape == (2, 4)
    assert_same_outputs(path, graph)


def test_inference_dropout_becomes_identity(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 8] x) => (float[2, 8] y, float[2, 8] z, bool[2, 8] mask) <float ratio = {0.5}> {
            off = Constant<value = bool {0}>()
            d1, unused = Dropout(x)
            y = Relu(d1)
            z = Dropout(x, ratio, off)
            kept, mask = Dropout(x)
        }""",
    )
    graph = load_onnx(path)
    ops = {n.outputs[0]: n.op_type for n in graph.nodes}
    assert ops == {"d1": "Identity", "y": "Relu", "z": "Identity", "kept": "Dropout"}  # a read mask stays


def test_dead_nodes_and_weights_are_removed(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[4] x) => (float[4] y) <float[4] w = {1, 2, 3, 4}> {
            dead = Mul(x, w)
            y = Relu(x)
        }""",
    )
    graph = load_onnx(path)
    assert [n.op_type for n in graph.nodes] == ["Relu"] and graph.initializers == {}


def test_nodes_get_unique_names(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[4] x) => (float[4] y) {
            a = Relu(x)
            b = Neg(a)
            y = Abs(b)
        }""",
    )
    model = onnx.load(path)
    model.graph.node[1].name = "same"
    model.graph.node[2].name = "same"
    onnx.save(model, path)
    assert [n.name for n in load_onnx(path).nodes] == ["Relu_0", "same", "Abs_2"]


def test_string_attributes_are_decoded(tmp_path: Path) -> None:
    path = write_model(
        tmp_path,
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[1, 1, 4, 4] x) => (float[1, 1, 8, 8] y) <float[4] scales = {1, 1, 2, 2}> {
            y = Resize<mode = "nearest">(x, , scales)
        }""",
    )
    (node,) = load_onnx(path).nodes
    assert node.attrs["mode"] == "nearest" and node.inputs == ("x", "", "scales")
