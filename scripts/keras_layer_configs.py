"""Writes tests/data/keras_layer_configs.json: Keras' own serialization
(`keras.saving.serialize_keras_object(layer)`) of every layer class anygpu rebuilds, with
non-default arguments, for tests/saved_model.rs (`keras_configs_*`): anygpu must read each one
and write back the same values under the same key names.

Rerun: python3 scripts/keras_layer_configs.py   (Keras 3, any backend; no GPU needed)
"""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras  # noqa: E402

L = keras.layers
LAYERS = [
    L.Conv2D(8, (3, 5), strides=(2, 1), padding="same", dilation_rate=1, activation="relu", use_bias=False),
    L.Conv2D(4, 3, dilation_rate=2, activation="gelu"),
    L.SeparableConv2D(6, 3, strides=2, padding="same", depth_multiplier=2, activation="selu"),
    L.DepthwiseConv2D((3, 3), strides=1, padding="valid", depth_multiplier=3, activation="elu", use_bias=False),
    L.Dense(10, activation="softmax"),
    L.Dense(4, activation="tanh"),
    L.Flatten(),
    L.MaxPooling2D(),
    L.AveragePooling2D((3, 2), strides=(1, 2), padding="same"),
    L.AveragePooling2D(2),
    L.GlobalAveragePooling2D(),
    L.GlobalMaxPooling2D(),
    L.BatchNormalization(momentum=0.9, epsilon=1e-5, center=False),
    L.Dropout(0.3, seed=7),
    L.Dropout(0.5),
    L.Activation("sigmoid"),
    L.ReLU(max_value=6.0, negative_slope=0.1, threshold=0.5),
    L.ReLU(),
    L.Dense(3, activation="relu6", dtype="mixed_float16"),
]

out = [keras.saving.serialize_keras_object(layer) for layer in LAYERS]
path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "keras_layer_configs.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"wrote {len(out)} layer configs to {path} (Keras {keras.__version__})")
