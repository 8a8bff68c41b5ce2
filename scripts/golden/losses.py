"""Keras' losses and metrics on fixed outputs and targets (`tests/golden/losses.rs`).

Loss cases: the mean loss (Keras' default `sum_over_batch_size`) and its gradient w.r.t. what
the model's last layer computes: the logits `z` where the loss runs on logits (`from_logits`,
or a softmax/sigmoid output whose logits Keras 3 keeps and uses), the output itself otherwise.
`dense_*` cases put a Dense layer with its activation under the loss and give the kernel and
bias gradients. Metric cases: one metric's value on a fixed batch.
"""

import numpy as np
import tensorflow as tf
import keras

from golden._common import values


def onehot(rows, cols, seed):
    rng = np.random.default_rng(seed)
    y = np.zeros((rows, cols), np.float32)
    y[np.arange(rows), rng.integers(0, cols, rows)] = 1.0
    return y


def bits(shape, seed):
    return (values(shape, seed) > 0).astype(np.float32)


def probabilities(rows, cols, seed):
    """Rows of positive values summing to 1."""
    e = np.exp(2.0 * values((rows, cols), seed)).astype(np.float32)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def loss_case(name, loss, dtype, z, y, act=None, config=None):
    """`loss(y, act(z))` and its gradient w.r.t. `z` (`act` a Keras activation or None)."""
    zt = tf.constant(z, dtype=dtype)
    yt = tf.constant(y, dtype=dtype)
    with tf.GradientTape() as tape:
        tape.watch(zt)
        out = zt if act is None else act(zt)
        value = loss(yt, out)
    dz = tape.gradient(value, zt)
    return {
        "name": name,
        "config": config or {},
        "inputs": {"z": z, "y": y},
        "outputs": {"loss": value, "dz": dz},
    }


def cce(dtype, **kw):
    return keras.losses.CategoricalCrossentropy(dtype=dtype, **kw)


def bce(dtype, **kw):
    return keras.losses.BinaryCrossentropy(dtype=dtype, **kw)


def cce_logits(dtype):
    z = 3.0 * values((6, 5), 1)
    return loss_case(
        "cce_logits", cce(dtype, from_logits=True), dtype, z, onehot(6, 5, 2),
        config={"kind": "categorical_logits", "act": "linear", "label_smoothing": 0.0},
    )


def cce_logits_smoothing(dtype):
    z = 3.0 * values((6, 5), 3)
    return loss_case(
        "cce_logits_smoothing", cce(dtype, from_logits=True, label_smoothing=0.2), dtype,
        z, onehot(6, 5, 4),
        config={"kind": "categorical_logits", "act": "linear", "label_smoothing": 0.2},
    )


def cce_softmax_fold(dtype):
    # A softmax output keeps its logits: Keras computes the loss on them.
    z = 4.0 * values((7, 4), 5)
    return loss_case(
        "cce_softmax_fold", cce(dtype, label_smoothing=0.1), dtype, z, onehot(7, 4, 6),
        act=keras.activations.softmax,
        config={"kind": "categorical_logits", "act": "softmax", "label_smoothing": 0.1},
    )


def cce_probabilities(dtype):
    p = probabilities(5, 4, 7)
    p[0] = [1.0, 0.0, 0.0, 0.0]  # clipped entries
    return loss_case(
        "cce_probabilities", cce(dtype), dtype, p, onehot(5, 4, 8),
        config={"kind": "categorical_probs", "act": "linear", "label_smoothing": 0.0},
    )


def cce_probabilities_smoothing(dtype):
    p = probabilities(5, 4, 9)
    return loss_case(
        "cce_probabilities_smoothing", cce(dtype, label_smoothing=0.3), dtype, p,
        onehot(5, 4, 10),
        config={"kind": "categorical_probs", "act": "linear", "label_smoothing": 0.3},
    )


def bce_logits(dtype):
    z = 6.0 * values((6, 3), 11)
    return loss_case(
        "bce_logits", bce(dtype, from_logits=True), dtype, z, bits((6, 3), 12),
        config={"kind": "binary_logits", "act": "linear", "label_smoothing": 0.0},
    )


def bce_logits_smoothing(dtype):
    z = 6.0 * values((6, 3), 13)
    return loss_case(
        "bce_logits_smoothing", bce(dtype, from_logits=True, label_smoothing=0.2), dtype, z,
        bits((6, 3), 14),
        config={"kind": "binary_logits", "act": "linear", "label_smoothing": 0.2},
    )


def bce_sigmoid_fold(dtype):
    z = 5.0 * values((8, 1), 15)
    z[0, 0] = 30.0  # far out: the fold keeps it finite and exact
    return loss_case(
        "bce_sigmoid_fold", bce(dtype), dtype, z, bits((8, 1), 16),
        act=keras.activations.sigmoid,
        config={"kind": "binary_logits", "act": "sigmoid", "label_smoothing": 0.0},
    )


def bce_probabilities(dtype):
    p = 0.5 * values((5, 3), 17) + 0.5
    p[0, 0], p[1, 1] = 0.0, 1.0  # clipped entries
    return loss_case(
        "bce_probabilities", bce(dtype, label_smoothing=0.1), dtype, p, bits((5, 3), 18),
        config={"kind": "binary_probs", "act": "linear", "label_smoothing": 0.1},
    )


def mse(dtype):
    o = values((6, 3), 19)
    return loss_case(
        "mse", keras.losses.MeanSquaredError(dtype=dtype), dtype, o, values((6, 3), 20),
        config={"kind": "mean_squared", "act": "linear", "label_smoothing": 0.0},
    )


def mae(dtype):
    o = values((6, 3), 21)
    y = values((6, 3), 22)
    y[2, 1] = o[2, 1]  # a zero difference: TF's gradient there is 0
    return loss_case(
        "mae", keras.losses.MeanAbsoluteError(dtype=dtype), dtype, o, y,
        config={"kind": "mean_absolute", "act": "linear", "label_smoothing": 0.0},
    )


def mse_sigmoid(dtype):
    # A regression loss sees the activated output: the gradient goes through the sigmoid.
    z = 3.0 * values((5, 2), 23)
    return loss_case(
        "mse_sigmoid", keras.losses.MeanSquaredError(dtype=dtype), dtype, z,
        0.5 * values((5, 2), 24) + 0.5, act=keras.activations.sigmoid,
        config={"kind": "mean_squared", "act": "sigmoid", "label_smoothing": 0.0},
    )


def mae_softmax(dtype):
    z = 3.0 * values((5, 4), 25)
    return loss_case(
        "mae_softmax", keras.losses.MeanAbsoluteError(dtype=dtype), dtype, z,
        probabilities(5, 4, 26), act=keras.activations.softmax,
        config={"kind": "mean_absolute", "act": "softmax", "label_smoothing": 0.0},
    )


def dense_case(name, units, activation, loss, dtype, y, config):
    """Dense(units, activation) on x, then `loss`: the mean loss, kernel and bias gradients."""
    x = values((8, 5), 30)
    kernel = values((5, units), 31)
    bias = 0.1 * values((units,), 32)
    layer = keras.layers.Dense(units, activation=activation, dtype=dtype)
    xt = tf.constant(x, dtype=dtype)
    layer.build(xt.shape)
    layer.kernel.assign(tf.constant(kernel, dtype=dtype))
    layer.bias.assign(tf.constant(bias, dtype=dtype))
    with tf.GradientTape() as tape:
        value = loss(tf.constant(y, dtype=dtype), layer(xt))
    dk, db = tape.gradient(value, [layer.kernel, layer.bias])
    return {
        "name": name,
        "config": {"units": units, "activation": activation, **config},
        "inputs": {"x": x, "kernel": kernel, "bias": bias, "y": y},
        "outputs": {"loss": value, "dkernel": dk, "dbias": db},
    }


def dense_softmax_cce(dtype):
    return dense_case(
        "dense_softmax_cce", 4, "softmax", cce(dtype, label_smoothing=0.1), dtype,
        onehot(8, 4, 33), {"loss": "categorical_crossentropy", "label_smoothing": 0.1},
    )


def dense_sigmoid_bce(dtype):
    return dense_case(
        "dense_sigmoid_bce", 3, "sigmoid", bce(dtype), dtype, bits((8, 3), 34),
        {"loss": "binary_crossentropy", "label_smoothing": 0.0},
    )


def dense_linear_mse(dtype):
    return dense_case(
        "dense_linear_mse", 2, "linear", keras.losses.MeanSquaredError(dtype=dtype), dtype,
        values((8, 2), 35), {"loss": "mean_squared_error", "label_smoothing": 0.0},
    )


def dense_linear_mae(dtype):
    return dense_case(
        "dense_linear_mae", 2, "linear", keras.losses.MeanAbsoluteError(dtype=dtype), dtype,
        values((8, 2), 36), {"loss": "mean_absolute_error", "label_smoothing": 0.0},
    )


def metric_case(name, metric, dtype, p, y, config):
    # TF's in_top_k has float32 kernels only: the top-k cases score in float32 in both runs.
    p_dtype = "float32" if config["metric"].startswith("sparse_top_k") else dtype
    metric.update_state(tf.constant(y), tf.constant(p, dtype=p_dtype))
    return {
        "name": name,
        "config": config,
        "inputs": {"p": p, "y": y},
        "outputs": {"value": metric.result()},
    }


def top_k_scores():
    p = probabilities(10, 6, 40)
    p[0] = [0.3, 0.3, 0.3, 0.05, 0.05, 0.0]  # a three-way tie for first
    p[1] = [0.1, 0.2, 0.2, 0.2, 0.2, 0.1]  # four tied for second
    return p


def sparse_top_k_default(dtype):
    labels = np.array([2, 5, 0, 1, 2, 3, 4, 5, 0, 1], np.int32)
    return metric_case(
        "sparse_top_k_default", keras.metrics.SparseTopKCategoricalAccuracy(dtype=dtype),
        dtype, top_k_scores(), labels, {"metric": "sparse_top_k_categorical_accuracy", "k": 5},
    )


def sparse_top_k_ties(dtype):
    labels = np.array([2, 4, 0, 1, 2, 3, 4, 5, 0, 1], np.int32)
    return metric_case(
        "sparse_top_k_ties", keras.metrics.SparseTopKCategoricalAccuracy(k=1, dtype=dtype),
        dtype, top_k_scores(), labels, {"metric": "sparse_top_k_categorical_accuracy", "k": 1},
    )


def sparse_top_k_two(dtype):
    labels = np.array([1, 5, 3, 1, 2, 3, 4, 5, 0, 1], np.int32)
    return metric_case(
        "sparse_top_k_two", keras.metrics.SparseTopKCategoricalAccuracy(k=2, dtype=dtype),
        dtype, top_k_scores(), labels, {"metric": "sparse_top_k_categorical_accuracy", "k": 2},
    )


def categorical_accuracy(dtype):
    p = probabilities(12, 5, 41)
    y = onehot(12, 5, 42)
    y[:4] = np.eye(5, dtype=np.float32)[np.argmax(p[:4], axis=1)]  # some hits
    return metric_case(
        "categorical_accuracy", keras.metrics.CategoricalAccuracy(dtype=dtype), dtype, p, y,
        {"metric": "categorical_accuracy"},
    )


def binary_accuracy(dtype):
    p = 0.5 * values((9, 3), 43) + 0.5
    p[0, 0] = 0.5  # on the threshold: not above it
    return metric_case(
        "binary_accuracy", keras.metrics.BinaryAccuracy(dtype=dtype), dtype, p,
        bits((9, 3), 44), {"metric": "binary_accuracy", "threshold": 0.5},
    )


def binary_accuracy_threshold(dtype):
    p = 0.5 * values((9, 3), 45) + 0.5
    return metric_case(
        "binary_accuracy_threshold", keras.metrics.BinaryAccuracy(threshold=0.7, dtype=dtype),
        dtype, p, bits((9, 3), 46), {"metric": "binary_accuracy", "threshold": 0.7},
    )


def mean_squared_error_metric(dtype):
    return metric_case(
        "mean_squared_error_metric", keras.metrics.MeanSquaredError(dtype=dtype), dtype,
        values((7, 3), 47), values((7, 3), 48), {"metric": "mean_squared_error"},
    )


CASES = [
    cce_logits,
    cce_logits_smoothing,
    cce_softmax_fold,
    cce_probabilities,
    cce_probabilities_smoothing,
    bce_logits,
    bce_logits_smoothing,
    bce_sigmoid_fold,
    bce_probabilities,
    mse,
    mae,
    mse_sigmoid,
    mae_softmax,
    dense_softmax_cce,
    dense_sigmoid_bce,
    dense_linear_mse,
    dense_linear_mae,
    sparse_top_k_default,
    sparse_top_k_ties,
    sparse_top_k_two,
    categorical_accuracy,
    binary_accuracy,
    binary_accuracy_threshold,
    mean_squared_error_metric,
]
