"""The tutorial's layers: Conv2D, SeparableConv2D, MaxPool2D, Dense, with their activations."""

from golden._common import layer_case, values
import tensorflow as tf

L = tf.keras.layers


def conv2d(padding, activation, k=3, cin=3, cout=5):
    def case(dtype):
        x = values((2, 7, 6, cin), 1)
        weights = {"kernel": values((k, k, cin, cout), 2, -0.5, 0.5), "bias": values((cout,), 3, -0.2, 0.2)}
        layer = L.Conv2D(cout, k, padding=padding, activation=activation, dtype=dtype)
        config = {"filters": cout, "kernel_size": k, "padding": padding, "activation": activation}
        return layer_case(f"conv2d_{padding}_{activation}_k{k}", layer, dtype, x, weights, config=config)

    return case


def separable(activation, cin=4, cout=6):
    def case(dtype):
        x = values((2, 6, 5, cin), 11)
        weights = {
            "depthwise_kernel": values((3, 3, cin, 1), 12, -0.5, 0.5),
            "pointwise_kernel": values((1, 1, cin, cout), 13, -0.5, 0.5),
            "bias": values((cout,), 14, -0.2, 0.2),
        }
        layer = L.SeparableConv2D(cout, 3, padding="same", activation=activation, dtype=dtype)
        config = {"filters": cout, "kernel_size": 3, "padding": "same", "activation": activation}
        return layer_case(f"separable_conv2d_{activation}", layer, dtype, x, weights, config=config)

    return case


def max_pool(h, w):
    def case(dtype):
        x = values((2, h, w, 3), 21)
        layer = L.MaxPool2D(dtype=dtype)
        return layer_case(f"max_pool2d_{h}x{w}", layer, dtype, x, {}, config={"pool_size": 2})

    return case


def dense(activation, fin=9, units=7):
    def case(dtype):
        x = values((5, fin), 31)
        weights = {"kernel": values((fin, units), 32, -0.5, 0.5), "bias": values((units,), 33, -0.2, 0.2)}
        layer = L.Dense(units, activation=activation, dtype=dtype)
        config = {"units": units, "activation": activation}
        return layer_case(f"dense_{activation}", layer, dtype, x, weights, config=config)

    return case


CASES = [
    conv2d("valid", "linear"),
    conv2d("same", "selu"),
    conv2d("same", "relu", k=5),
    conv2d("valid", "relu", k=1, cin=8, cout=4),
    separable("selu"),
    separable("linear"),
    max_pool(6, 6),
    max_pool(7, 5),
    dense("linear"),
    dense("relu"),
    dense("selu"),
]
