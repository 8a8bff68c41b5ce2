"""Keras' activations: each as a `keras.layers.Activation` on inputs over [-6, 6] (the kinks
0, 1, 1.5, 5 and 6 included exactly), the `ReLU` layer's configurations, and Dense, Conv2D and
SeparableConv2D layers with the activations that run as their own op."""

import numpy as np
import tensorflow as tf

from golden._common import layer_case, values

L = tf.keras.layers


def spread():
    """[-6, 6] in steps of 0.06, 0 exact, plus the kinks 1 and 5: a [4, 51] batch."""
    x = np.linspace(-6.0, 6.0, 201)
    x[np.abs(x) < 1e-9] = 0.0
    x = np.concatenate([x, [1.0, 5.0, 1.5]])
    return x.astype(np.float32).reshape(4, 51)


def activation(name, approximate=None):
    def case(dtype):
        if approximate is None:
            layer = L.Activation(name, dtype=dtype)
            label = name
        else:
            layer = L.Activation(
                lambda t: tf.keras.activations.gelu(t, approximate=approximate), dtype=dtype
            )
            label = f"{name}_approximate"
        config = {"activation": name, "approximate": bool(approximate)}
        return layer_case(f"activation_{label}", layer, dtype, spread(), {}, config=config)

    return case


def relu_layer(label, **kwargs):
    def case(dtype):
        layer = L.ReLU(dtype=dtype, **kwargs)
        config = {
            "max_value": kwargs.get("max_value"),
            "negative_slope": kwargs.get("negative_slope", 0.0),
            "threshold": kwargs.get("threshold", 0.0),
        }
        return layer_case(f"relu_layer_{label}", layer, dtype, spread(), {}, config=config)

    return case


def dense(act, fin=9, units=7):
    def case(dtype):
        x = values((5, fin), 31, -2.0, 2.0)
        weights = {"kernel": values((fin, units), 32, -0.8, 0.8), "bias": values((units,), 33, -0.3, 0.3)}
        layer = L.Dense(units, activation=act, dtype=dtype)
        config = {"units": units, "activation": act}
        return layer_case(f"dense_{act}", layer, dtype, x, weights, config=config)

    return case


def conv2d(padding, act, k=3, cin=3, cout=5):
    def case(dtype):
        x = values((2, 7, 6, cin), 1, -2.0, 2.0)
        weights = {"kernel": values((k, k, cin, cout), 2, -0.5, 0.5), "bias": values((cout,), 3, -0.2, 0.2)}
        layer = L.Conv2D(cout, k, padding=padding, activation=act, dtype=dtype)
        config = {"filters": cout, "kernel_size": k, "padding": padding, "activation": act}
        return layer_case(f"conv2d_{padding}_{act}", layer, dtype, x, weights, config=config)

    return case


def separable(act, cin=4, cout=6):
    def case(dtype):
        x = values((2, 6, 5, cin), 11, -2.0, 2.0)
        weights = {
            "depthwise_kernel": values((3, 3, cin, 1), 12, -0.5, 0.5),
            "pointwise_kernel": values((1, 1, cin, cout), 13, -0.5, 0.5),
            "bias": values((cout,), 14, -0.2, 0.2),
        }
        layer = L.SeparableConv2D(cout, 3, padding="same", activation=act, dtype=dtype)
        config = {"filters": cout, "kernel_size": 3, "padding": "same", "activation": act}
        return layer_case(f"separable_conv2d_{act}", layer, dtype, x, weights, config=config)

    return case


CASES = [
    *[
        activation(name)
        for name in [
            "linear",
            "relu",
            "relu6",
            "leaky_relu",
            "elu",
            "selu",
            "gelu",
            "sigmoid",
            "tanh",
            "swish",
            "silu",
            "softplus",
        ]
    ],
    activation("gelu", approximate=True),
    relu_layer("default"),
    relu_layer("max6", max_value=6.0),
    relu_layer("max5_slope", max_value=5.0, negative_slope=0.5),
    relu_layer("threshold", threshold=1.5),
    relu_layer("slope_threshold", negative_slope=0.3, threshold=1.0),
    relu_layer("slope", negative_slope=0.2),
    relu_layer("threshold_max", threshold=1.0, max_value=5.0),
    dense("gelu"),
    dense("swish"),
    dense("softplus"),
    dense("leaky_relu"),
    dense("tanh"),
    conv2d("same", "elu"),
    conv2d("valid", "sigmoid"),
    conv2d("same", "gelu"),
    separable("relu6"),
    separable("silu"),
]
