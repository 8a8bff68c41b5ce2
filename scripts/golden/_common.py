"""Helpers shared by the golden cases: seeded inputs and a layer's forward/backward."""

import numpy as np
import tensorflow as tf


def values(shape, seed, low=-1.0, high=1.0):
    """Float32 values in [low, high), the same on every run."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(np.float32)


def layer_case(name, layer, dtype, x, weights, dy_seed=99, config=None, training=None):
    """Builds `layer` on `x`'s shape, sets `weights` (name -> float32 array, in the layer's
    order), runs it on `x` and backpropagates `dy` (seeded values shaped like the output).

    Outputs: `y`, `dx`, and `d<weight>` for every weight."""
    xt = tf.constant(x, dtype=dtype)
    layer.build(xt.shape)
    for var, (key, value) in zip(layer.weights, weights.items()):
        if tuple(var.shape) != value.shape:
            raise SystemExit(f"{name}: weight {key} is {var.shape}, given {value.shape}")
        var.assign(tf.constant(value, dtype=dtype))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt) if training is None else layer(xt, training=training)
        dy = tf.constant(values(tuple(y.shape), dy_seed), dtype=dtype)
        objective = tf.reduce_sum(y * dy)
    trainable = [v for v in layer.weights if v.trainable]
    grads = tape.gradient(objective, [xt] + trainable)
    outputs = {"y": y, "dx": grads[0]}
    by_var = {id(v): g for v, g in zip(trainable, grads[1:])}
    for var, key in zip(layer.weights, weights):
        if id(var) in by_var:
            outputs[f"d{key}"] = by_var[id(var)]
    inputs = {"x": x, "dy": values(tuple(y.shape), dy_seed), **weights}
    return {"name": name, "config": config or {}, "inputs": inputs, "outputs": outputs}
