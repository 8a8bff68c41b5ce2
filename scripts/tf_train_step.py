"""TensorFlow's side of the CPU:0 speed comparison (scripts/cpu_vs_tf.sh): the training step of the
tutorial CNN, or of the modern one (`fashion_mnist --model modern`).

Times N training steps at batch 128 after a warm-up, as `fashion_mnist --time-steps N` does,
so the two can be run alternately on the same machine (its speed drifts by tens of percent
within an hour, so only side-by-side numbers compare):

    pip install tensorflow-cpu==2.21.*
    python3 scripts/tf_train_step.py 40
    cargo run --release --example fashion_mnist -- --device cpu --time-steps 40
    python3 scripts/tf_train_step.py 40 modern
    cargo run --release --example fashion_mnist -- --model modern --device cpu --time-steps 40

Random inputs: a step's cost does not depend on the pixel values. `TF_THREADS=N` pins
TensorFlow's intra-op pool to N threads (inter-op 1); on the 2-core VM neither 1 nor 2 beat
the default.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
layers = keras.layers


def tutorial_cnn():
    sep = lambda f: layers.SeparableConv2D(f, 3, padding="same", activation="selu")  # noqa: E731
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, padding="same", activation="selu"),
            sep(32),
            layers.MaxPool2D(),
            sep(64),
            sep(64),
            layers.MaxPool2D(),
            sep(128),
            sep(128),
            layers.MaxPool2D(),
            layers.Flatten(),
            layers.Dense(128, activation="selu"),
            layers.Dense(10, activation="softmax"),
        ]
    )


def modern_cnn():
    """examples/fashion_mnist/models.rs's modern CNN: Conv-BN-ReLU blocks, strided convolutions,
    global average pooling, Dropout (141,098 weights)."""
    stack = [keras.Input((28, 28, 1))]
    for filters, strides in [(32, 1), (32, 2), (64, 1), (64, 2), (128, 1)]:
        stack += [
            layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False),
            layers.BatchNormalization(),
            layers.ReLU(),
        ]
    stack += [
        layers.GlobalAveragePooling2D(),
        layers.Dropout(0.3),
        layers.Dense(10, activation="softmax"),
    ]
    return keras.Sequential(stack)


def main():
    if os.environ.get("TF_THREADS"):
        n = int(os.environ["TF_THREADS"])
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    name = sys.argv[2] if len(sys.argv) > 2 else "tutorial"
    batch = 128
    tf.keras.utils.set_random_seed(0)
    if name == "modern":
        # Its optimizer in the example: AdamW, with a schedule that costs nothing per step.
        model = modern_cnn()
        optimizer = keras.optimizers.AdamW(learning_rate=0.003, weight_decay=0.004)
    elif name == "tutorial":
        model = tutorial_cnn()
        optimizer = keras.optimizers.SGD(learning_rate=0.01)
    else:
        sys.exit(f"unknown model {name!r}: tutorial or modern")
    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=optimizer,
        metrics=["accuracy"],
    )
    rng = np.random.default_rng(0)
    # Tensors made once, before timing, as ours are uploaded before timing (benches/train_step.rs,
    # `--time-steps`): the batch's conversion and upload are outside the timing on both sides.
    x = tf.constant(rng.standard_normal((batch, 28, 28, 1), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, batch))
    for _ in range(10):
        model.train_on_batch(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append((time.perf_counter() - start) * 1e3)
    med = statistics.median(times)
    print(
        f"tensorflow {tf.__version__} median train step: {med:.1f} ms "
        f"(batch {batch}; min {min(times):.1f}, max {max(times):.1f} over {steps} steps; "
        f"{batch / med * 1e3:.0f} images/s)"
    )


if __name__ == "__main__":
    main()
