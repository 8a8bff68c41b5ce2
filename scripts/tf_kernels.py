"""TensorFlow's side of the CPU:0 kernel comparison (issue 5): each layer of the tutorial CNN
at batch 128, forward and forward + backward, as `benches/kernels.rs` times ours.

    pip install tensorflow-cpu==2.21.*
    python3 scripts/tf_kernels.py            # median and min of 30 runs each, ms
    ANYGPU_BENCH_DEVICES=cpu cargo bench --bench kernels

Run the two alternately: this VM's speed drifts by tens of percent within an hour.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

BATCH = 128
layers = tf.keras.layers


def timed(fn, runs):
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def layer_case(name, layer, in_shape, input_grad=True):
    """Forward and forward + backward of one Keras layer on random data."""
    x = tf.random.normal((BATCH, *in_shape))
    layer.build(x.shape)
    dy = tf.random.normal(layer.compute_output_shape(x.shape))

    @tf.function
    def fwd():
        return layer(x)

    @tf.function
    def fwd_bwd():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        wrt = ([x] if input_grad else []) + layer.trainable_variables
        return tape.gradient(y, wrt, output_gradients=dy)

    return name, fwd, fwd_bwd


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    act = "relu"  # as benches/kernels.rs
    sep = lambda f: layers.SeparableConv2D(f, 3, padding="same", activation=act)  # noqa: E731
    cases = [
        layer_case(
            "conv2d_1x32_28",
            layers.Conv2D(32, 3, padding="same", activation=act),
            (28, 28, 1),
            input_grad=False,
        ),
        layer_case("sepconv_32x32_28", sep(32), (28, 28, 32)),
        layer_case("sepconv_32x64_14", sep(64), (14, 14, 32)),
        layer_case("sepconv_64x64_14", sep(64), (14, 14, 64)),
        layer_case("sepconv_64x128_7", sep(128), (7, 7, 64)),
        layer_case("sepconv_128x128_7", sep(128), (7, 7, 128)),
        layer_case("maxpool_32x28", layers.MaxPool2D(), (28, 28, 32)),
        layer_case("dense_1152x128", layers.Dense(128, activation=act), (1152,)),
    ]
    print(f"tensorflow {tf.__version__}, batch {BATCH}, ms: median (min) of {runs}")
    for name, fwd, fwd_bwd in cases:
        f_med, f_min = timed(fwd, runs)
        b_med, b_min = timed(fwd_bwd, runs)
        print(f"{name:20} fwd {f_med:6.2f} ({f_min:6.2f})   fwd+bwd {b_med:6.2f} ({b_min:6.2f})")
    a = tf.random.normal((1024, 1024))
    b = tf.random.normal((1024, 1024))
    mm = tf.function(lambda: tf.linalg.matmul(a, b))
    med, best = timed(lambda: mm().numpy(), runs)
    print(f"{'matmul_1024':20} {med:6.2f} ms ({best:6.2f}): {2 * 1024**3 / best / 1e6:.0f} GFLOP/s at best")


if __name__ == "__main__":
    main()
