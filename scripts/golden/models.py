"""A whole model rather than one layer: the modern CNN's blocks (`--model modern`, scaled down):
Conv2D without bias (16 channels each way, so CPU:0 takes Winograd's algorithm),
BatchNormalization, ReLU, a strided Conv2D, global average pooling and a softmax Dense, under
sparse categorical cross-entropy. One training pass (`training=True`): the loss, every trainable
weight's gradient, and the moving statistics after it. Checks how the layers compose (the
BatchNormalization → ReLU → Conv2D seams) on top of each layer's own case."""

import numpy as np
import tensorflow as tf

from golden._common import values

L = tf.keras.layers


def modern_blocks(dtype):
    x = values((4, 6, 6, 2), 71)
    y = np.array([0, 2, 1, 2], np.int32)
    conv = lambda filters, strides: L.Conv2D(  # noqa: E731
        filters, 3, strides=strides, padding="same", use_bias=False, dtype=dtype
    )
    layers = [tf.keras.Input((6, 6, 2), dtype=dtype)]
    for filters, strides in [(16, 1), (16, 1), (8, 2)]:
        layers += [conv(filters, strides), L.BatchNormalization(dtype=dtype), L.ReLU(dtype=dtype)]
    layers += [L.GlobalAveragePooling2D(dtype=dtype), L.Dense(3, activation="softmax", dtype=dtype)]
    model = tf.keras.Sequential(layers)
    inputs = {"x": x, "y": y}
    for i, w in enumerate(model.weights):
        name = w.path
        if "moving_variance" in name:
            value = values(tuple(w.shape), 80 + i, 0.5, 2.0)
        elif "gamma" in name:
            value = values(tuple(w.shape), 80 + i, 0.5, 1.5)
        else:
            value = values(tuple(w.shape), 80 + i, -0.5, 0.5)
        w.assign(tf.constant(value, dtype=dtype))
        inputs[f"w{i}"] = value
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(tf.constant(x, dtype=dtype), training=True))
    grads = tape.gradient(loss, model.trainable_weights)
    outputs = {"loss": tf.reshape(loss, [1])}
    outputs.update({f"d{i}": g for i, g in enumerate(grads)})
    outputs.update({f"after{i}": w.value for i, w in enumerate(model.weights) if "moving" in w.path})
    return {"name": "modern_blocks", "config": {}, "inputs": inputs, "outputs": outputs}


CASES = [modern_blocks]
