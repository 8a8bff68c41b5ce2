"""Convolutions beyond stride 1: Conv2D with strides, dilation, rectangular kernels and no bias;
DepthwiseConv2D (multiplier 1 and 2, strides); SeparableConv2D with strides and a multiplier.
Odd and even input sizes, so that 'same' pads asymmetrically (TF puts the odd zero after).
And stride-1 3×3 Conv2D between 16 channels or more, which CPU:0 runs on Winograd's algorithm."""

from golden._common import layer_case, values
import tensorflow as tf

L = tf.keras.layers


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def window_config(kernel, strides, padding, dilation, activation):
    (kh, kw), (sh, sw), (dh, dw) = pair(kernel), pair(strides), pair(dilation)
    return {
        "kh": kh, "kw": kw, "sh": sh, "sw": sw, "dh": dh, "dw": dw,
        "padding": padding, "activation": activation,
    }


def conv2d(name, hw, kernel, strides=1, padding="valid", dilation=1, activation="linear",
           use_bias=True, cin=3, cout=4):
    def case(dtype):
        kh, kw = pair(kernel)
        x = values((2, *hw, cin), 41)
        weights = {"kernel": values((kh, kw, cin, cout), 42, -0.5, 0.5)}
        if use_bias:
            weights["bias"] = values((cout,), 43, -0.2, 0.2)
        layer = L.Conv2D(cout, kernel, strides=strides, padding=padding, dilation_rate=dilation,
                         activation=activation, use_bias=use_bias, dtype=dtype)
        config = {"filters": cout, "use_bias": int(use_bias),
                  **window_config(kernel, strides, padding, dilation, activation)}
        return layer_case(f"conv2d_{name}", layer, dtype, x, weights, config=config)

    return case


def depthwise(name, hw, kernel, strides=1, padding="valid", dilation=1, multiplier=1,
              activation="linear", use_bias=True, cin=3):
    def case(dtype):
        kh, kw = pair(kernel)
        x = values((2, *hw, cin), 51)
        weights = {"kernel": values((kh, kw, cin, multiplier), 52, -0.5, 0.5)}
        if use_bias:
            weights["bias"] = values((cin * multiplier,), 53, -0.2, 0.2)
        layer = L.DepthwiseConv2D(kernel, strides=strides, padding=padding,
                                  depth_multiplier=multiplier, dilation_rate=dilation,
                                  activation=activation, use_bias=use_bias, dtype=dtype)
        config = {"depth_multiplier": multiplier, "use_bias": int(use_bias),
                  **window_config(kernel, strides, padding, dilation, activation)}
        return layer_case(f"depthwise_conv2d_{name}", layer, dtype, x, weights, config=config)

    return case


def separable(name, hw, kernel, strides=1, padding="valid", dilation=1, multiplier=1,
              activation="linear", cin=3, cout=5):
    def case(dtype):
        kh, kw = pair(kernel)
        x = values((2, *hw, cin), 61)
        weights = {
            "depthwise_kernel": values((kh, kw, cin, multiplier), 62, -0.5, 0.5),
            "pointwise_kernel": values((1, 1, cin * multiplier, cout), 63, -0.5, 0.5),
            "bias": values((cout,), 64, -0.2, 0.2),
        }
        layer = L.SeparableConv2D(cout, kernel, strides=strides, padding=padding,
                                  depth_multiplier=multiplier, dilation_rate=dilation,
                                  activation=activation, dtype=dtype)
        config = {"filters": cout, "depth_multiplier": multiplier,
                  **window_config(kernel, strides, padding, dilation, activation)}
        return layer_case(f"separable_conv2d_{name}", layer, dtype, x, weights, config=config)

    return case


CASES = [
    conv2d("s2_valid_7x6", (7, 6), 3, strides=2),
    conv2d("s2_same_7x6_k3", (7, 6), 3, strides=2, padding="same", activation="relu"),
    conv2d("s2_same_7x6_k4", (7, 6), 4, strides=2, padding="same"),
    conv2d("s2_same_8x8", (8, 8), 3, strides=2, padding="same", activation="selu"),
    conv2d("s21_same_7x6", (7, 6), 3, strides=(2, 1), padding="same"),
    conv2d("d2_same_9x8", (9, 8), 3, dilation=2, padding="same"),
    conv2d("d2_valid_9x8", (9, 8), 3, dilation=2, activation="selu"),
    conv2d("k3x5_valid", (7, 8), (3, 5)),
    conv2d("k3x5_s2_same", (7, 8), (3, 5), strides=2, padding="same"),
    conv2d("no_bias_s2", (7, 6), 3, strides=2, padding="same", use_bias=False),
    conv2d("no_bias_s1", (6, 5), 3, padding="same", use_bias=False, activation="relu"),
    conv2d("winograd_same_7x6", (7, 6), 3, padding="same", use_bias=False, cin=16, cout=24),
    conv2d("winograd_valid_8x7_relu", (8, 7), 3, activation="relu", cin=20, cout=17),
    depthwise("m1_s1_same", (7, 6), 3, padding="same"),
    depthwise("m1_s1_valid", (7, 6), 3),
    depthwise("m2_s1_same", (7, 6), 3, padding="same", multiplier=2, activation="relu"),
    depthwise("m1_s2_same", (7, 6), 3, strides=2, padding="same"),
    depthwise("m2_s2_valid", (7, 6), 3, strides=2, multiplier=2),
    depthwise("m2_s2_same_k4", (7, 6), 4, strides=2, padding="same", multiplier=2),
    depthwise("m1_d2_same", (9, 8), 3, dilation=2, padding="same", use_bias=False),
    separable("s2_m2_valid", (7, 6), 3, strides=2, multiplier=2),
    separable("s2_same", (7, 6), 3, strides=2, padding="same", activation="selu"),
    separable("s1_valid", (7, 6), 3),
    separable("m2_same", (6, 5), 3, padding="same", multiplier=2, activation="relu"),
]
