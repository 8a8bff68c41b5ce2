"""Keras 3 learning-rate schedules at a list of steps (boundaries and warm-up included):
`values` holds schedule(step) for each step of `steps` (an input, int32)."""

import numpy as np
import tensorflow as tf

S = tf.keras.optimizers.schedules

STEPS = np.array([0, 1, 2, 5, 9, 10, 11, 19, 20, 21, 25, 30, 31, 50, 99, 100, 101, 1000], dtype=np.int32)


def schedule_case(name, make, config):
    def case(dtype):
        schedule = make()
        got = [float(schedule(tf.constant(int(s), dtype=tf.int64))) for s in STEPS]
        return {"name": name, "config": config, "inputs": {"steps": STEPS},
                "outputs": {"values": np.array(got, dtype=np.float64)}}

    return case


CASES = [
    schedule_case("exponential", lambda: S.ExponentialDecay(0.1, 10, 0.5),
                  {"schedule": "exponential", "initial_learning_rate": 0.1, "decay_steps": 10,
                   "decay_rate": 0.5, "staircase": False}),
    schedule_case("exponential_staircase", lambda: S.ExponentialDecay(0.01, 7, 0.9, staircase=True),
                  {"schedule": "exponential", "initial_learning_rate": 0.01, "decay_steps": 7,
                   "decay_rate": 0.9, "staircase": True}),
    schedule_case("piecewise", lambda: S.PiecewiseConstantDecay([10, 20, 30], [1.0, 0.5, 0.1, 0.01]),
                  {"schedule": "piecewise", "boundaries": [10, 20, 30], "values": [1.0, 0.5, 0.1, 0.01]}),
    schedule_case("cosine", lambda: S.CosineDecay(0.1, 100),
                  {"schedule": "cosine", "initial_learning_rate": 0.1, "decay_steps": 100, "alpha": 0.0}),
    schedule_case("cosine_alpha", lambda: S.CosineDecay(0.1, 30, alpha=0.1),
                  {"schedule": "cosine", "initial_learning_rate": 0.1, "decay_steps": 30, "alpha": 0.1}),
    schedule_case("cosine_warmup", lambda: S.CosineDecay(0.0, 80, alpha=0.05, warmup_target=0.2, warmup_steps=20),
                  {"schedule": "cosine", "initial_learning_rate": 0.0, "decay_steps": 80, "alpha": 0.05,
                   "warmup_target": 0.2, "warmup_steps": 20}),
    schedule_case("cosine_warmup_from_nonzero", lambda: S.CosineDecay(0.01, 50, warmup_target=0.1, warmup_steps=10),
                  {"schedule": "cosine", "initial_learning_rate": 0.01, "decay_steps": 50, "alpha": 0.0,
                   "warmup_target": 0.1, "warmup_steps": 10}),
]
