"""TensorFlow's own numbers for the layer, loss and optimizer tests (`cargo test -- golden`).

Each module in `scripts/golden/` defines `CASES`, a list of functions `case(dtype)` that build a
Keras object in `dtype`, run it on fixed inputs and return a dict:

    {"name": "conv2d_same_selu",          # unique in the family
     "config": {...},                      # what the Rust test needs to build the same thing
     "inputs": {"x": array, "kernel": array, ...},    # float32 values, fed as given
     "outputs": {"y": array, "dx": array, ...}}       # TF's results

Every case runs twice, in float32 and float64, from the same float32 inputs. The file keeps the
float64 outputs (the reference), and for each output how far TF's own float32 result is from it
(`noise`), so a test's tolerance follows from TensorFlow's float32 noise, not a guess.

Writes `tests/golden/data/<module>.safetensors`: tensors named `<case>/<tensor>` (inputs in float32,
outputs in float64), metadata `cases` = JSON {case: {config, inputs, outputs, noise}}.

    pip install tensorflow-cpu==2.21.*
    python3 scripts/tf_golden.py            # every family
    python3 scripts/tf_golden.py layers     # one family

The files are committed; the tests need no Python. Rerun after changing a case.
"""

import importlib
import json
import os
import pathlib
import struct
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def write_safetensors(path, tensors, metadata):
    """The safetensors layout: u64 header length, JSON header, little-endian data."""
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        dtype = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int32"): "I32"}[
            array.dtype
        ]
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def as_numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def run_family(module_name):
    module = importlib.import_module(f"golden.{module_name}")
    tensors = {}
    cases = {}
    for make in module.CASES:
        tf.keras.backend.clear_session()
        lo = make("float32")
        tf.keras.backend.clear_session()
        hi = make("float64")
        name = lo["name"]
        if name in cases:
            raise SystemExit(f"{module_name}: two cases named {name}")
        entry = {"config": lo.get("config", {}), "inputs": [], "outputs": [], "noise": {}}
        for key, value in lo["inputs"].items():
            value = as_numpy(value)
            if value.dtype == np.float64:
                value = value.astype(np.float32)
            tensors[f"{name}/{key}"] = value
            entry["inputs"].append(key)
        for key, value in hi["outputs"].items():
            want = as_numpy(value).astype(np.float64)
            got32 = as_numpy(lo["outputs"][key]).astype(np.float64)
            if got32.shape != want.shape:
                raise SystemExit(f"{module_name}/{name}/{key}: shapes {got32.shape} vs {want.shape}")
            tensors[f"{name}/{key}"] = want
            entry["outputs"].append(key)
            entry["noise"][key] = float(np.max(np.abs(got32 - want))) if want.size else 0.0
        cases[name] = entry
    out = ROOT / "tests" / "golden" / "data" / f"{module_name}.safetensors"
    write_safetensors(
        out,
        tensors,
        {"cases": json.dumps(cases, sort_keys=True), "tensorflow": tf.__version__},
    )
    print(f"{out.relative_to(ROOT)}: {len(cases)} cases, {out.stat().st_size} bytes")


def main():
    families = sys.argv[1:] or sorted(
        p.stem for p in (ROOT / "scripts" / "golden").glob("*.py") if not p.stem.startswith("_")
    )
    for family in families:
        run_family(family)


if __name__ == "__main__":
    main()
