"""BatchNormalization: one training call (y, input and weight gradients, the moving statistics
after it) on rank-2 and rank-4 inputs, with and without center/scale; and inference from given
moving statistics. (Dropout's mask cannot match TensorFlow's random stream: its tests need no
golden numbers.)"""

from golden._common import layer_case, values
import numpy as np
import tensorflow as tf

L = tf.keras.layers


def batch_norm(name, shape, training, center=True, scale=True, momentum=0.9, epsilon=1e-3):
    def case(dtype):
        c = shape[-1]
        # An offset and a spread per channel, so the statistics are not those of [-1, 1).
        x = values(shape, 41) * np.linspace(0.5, 3.0, c, dtype=np.float32) + np.linspace(
            -2.0, 1.0, c, dtype=np.float32
        )
        weights = {}
        if scale:
            weights["gamma"] = values((c,), 42, 0.5, 1.5)
        if center:
            weights["beta"] = values((c,), 43, -0.5, 0.5)
        weights["moving_mean"] = values((c,), 44, -0.3, 0.3)
        weights["moving_variance"] = values((c,), 45, 0.5, 2.0)
        layer = L.BatchNormalization(
            momentum=momentum, epsilon=epsilon, center=center, scale=scale, dtype=dtype
        )
        config = {
            "momentum": momentum,
            "epsilon": epsilon,
            "center": int(center),
            "scale": int(scale),
            "training": int(training),
        }
        out = layer_case(name, layer, dtype, x, weights, config=config, training=training)
        # Named apart from the inputs of the same name (the moving statistics given).
        out["outputs"]["moving_mean_after"] = layer.moving_mean.value
        out["outputs"]["moving_variance_after"] = layer.moving_variance.value
        return out

    return case


CASES = [
    batch_norm("bn_rank2_train", (8, 5), True),
    batch_norm("bn_rank4_train", (2, 5, 4, 6), True),
    batch_norm("bn_rank4_train_plain", (2, 3, 3, 4), True, center=False, scale=False),
    batch_norm("bn_rank2_train_center_only", (6, 3), True, scale=False, momentum=0.99),
    batch_norm("bn_rank2_train_scale_only", (6, 3), True, center=False, epsilon=0.01),
    batch_norm("bn_rank4_inference", (2, 5, 4, 6), False),
    batch_norm("bn_rank2_inference", (8, 5), False, center=False),
]
