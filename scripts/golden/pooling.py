"""Pooling layers: AveragePooling2D and MaxPooling2D over several shapes, windows, strides and
paddings ('same' windows that overhang average their real elements only), GlobalAveragePooling2D
and GlobalMaxPooling2D."""

import tensorflow as tf

from golden._common import layer_case, values

L = tf.keras.layers


def windowed(kind, shape, pool, strides, padding, seed):
    """AveragePooling2D (`kind` "average") or MaxPooling2D ("max")."""

    def case(dtype):
        x = values(shape, seed)
        cls = L.AveragePooling2D if kind == "average" else L.MaxPooling2D
        layer = cls(pool_size=pool, strides=strides, padding=padding, dtype=dtype)
        s = strides or pool
        name = f"{kind}_pooling2d_{shape[1]}x{shape[2]}_p{pool[0]}x{pool[1]}_s{s[0]}x{s[1]}_{padding}"
        config = {"pool_size": list(pool), "strides": list(s), "padding": padding}
        return layer_case(name, layer, dtype, x, {}, config=config)

    return case


def average(*args):
    return windowed("average", *args)


def maximum(*args):
    return windowed("max", *args)


def global_pool(kind, shape, seed):
    def case(dtype):
        x = values(shape, seed)
        layer = (L.GlobalMaxPooling2D if kind == "max" else L.GlobalAveragePooling2D)(dtype=dtype)
        name = f"global_{kind}_pooling2d_{shape[1]}x{shape[2]}x{shape[3]}"
        return layer_case(name, layer, dtype, x, {}, config={"kind": kind})

    return case


CASES = [
    average((2, 6, 6, 3), (2, 2), None, "valid", 41),
    average((2, 7, 5, 3), (2, 2), None, "valid", 42),
    average((2, 7, 5, 3), (2, 2), None, "same", 43),
    average((1, 7, 7, 4), (3, 3), (2, 2), "same", 44),
    average((1, 7, 7, 4), (3, 3), (2, 2), "valid", 45),
    average((2, 6, 8, 2), (3, 2), (1, 2), "same", 46),
    average((1, 5, 5, 5), (5, 5), (1, 1), "same", 47),
    average((2, 9, 9, 8), (2, 2), (1, 1), "valid", 48),
    maximum((2, 6, 6, 3), (2, 2), None, "valid", 61),
    maximum((2, 7, 5, 3), (2, 2), None, "same", 62),
    maximum((1, 7, 7, 4), (3, 3), (2, 2), "same", 63),
    maximum((2, 8, 8, 4), (3, 3), (2, 2), "same", 64),
    maximum((1, 7, 7, 4), (3, 3), (2, 2), "valid", 65),
    maximum((2, 6, 8, 2), (3, 2), (1, 2), "same", 66),
    maximum((2, 9, 9, 8), (2, 2), (1, 1), "valid", 67),
    global_pool("avg", (2, 7, 7, 5), 51),
    global_pool("avg", (3, 1, 1, 4), 52),
    global_pool("avg", (2, 14, 14, 32), 53),
    global_pool("max", (2, 7, 7, 5), 54),
    global_pool("max", (3, 1, 1, 4), 55),
    global_pool("max", (2, 14, 14, 32), 56),
]
