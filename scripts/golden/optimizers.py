"""Keras 3 optimizers on fixed weights and three steps of fixed gradients: SGD, Adam, AdamW,
RMSprop (plain, momentum, centered, both), with weight decay, clipnorm, global_clipnorm,
clipvalue and a learning-rate schedule.

Each case has two variables (`w0` of shape (3, 4), `w1` of shape (4,): a Dense(4) on 3 features), gradients `g<step>_<i>`
for steps 0..2, and outputs the weights after every step (`w<i>_step<k>`) and the slots after
the last one (`<slot>_<i>`)."""

from golden._common import values
import tensorflow as tf

O = tf.keras.optimizers
S = tf.keras.optimizers.schedules

SHAPES = [(3, 4), (4,)]


def optimizer_case(name, make, config, grad_scale=1.0, slots=()):
    def case(dtype):
        weights = {f"w{i}": values(shape, 100 + i) for i, shape in enumerate(SHAPES)}
        grads = {
            f"g{step}_{i}": values(shape, 200 + 10 * step + i, -grad_scale, grad_scale)
            for step in range(3)
            for i, shape in enumerate(SHAPES)
        }
        variables = [tf.Variable(tf.constant(w, dtype=dtype)) for w in weights.values()]
        opt = make()
        outputs = {}
        for step in range(3):
            g = [tf.constant(grads[f"g{step}_{i}"], dtype=dtype) for i in range(len(SHAPES))]
            opt.apply_gradients(zip(g, variables))
            for i, v in enumerate(variables):
                outputs[f"w{i}_step{step}"] = v.numpy()
        for slot in slots:
            for i, v in enumerate(variables):
                outputs[f"{slot}_{i}"] = _slot(opt, slot, v)
        return {"name": name, "config": config, "inputs": {**weights, **grads}, "outputs": outputs}

    return case


def _slot(opt, slot, var):
    """The optimizer variable `slot` of `var` (Keras 3 keeps lists per slot kind)."""
    lists = {
        "momentum": getattr(opt, "_momentums", None) or getattr(opt, "momentums", None),
        "velocity": getattr(opt, "_velocities", None),
        "average_gradient": getattr(opt, "_average_gradients", None),
    }
    return lists[slot][opt._get_variable_index(var)].numpy()


def rms(**kw):
    return lambda: O.RMSprop(**kw)


CASES = [
    optimizer_case("sgd", lambda: O.SGD(learning_rate=0.1), {"optimizer": "sgd", "learning_rate": 0.1}),
    optimizer_case(
        "sgd_momentum_decay",
        lambda: O.SGD(learning_rate=0.1, momentum=0.9, weight_decay=0.05),
        {"optimizer": "sgd", "learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.05},
        slots=["momentum"],
    ),
    optimizer_case(
        "sgd_clipnorm",
        lambda: O.SGD(learning_rate=0.1, clipnorm=0.5),
        {"optimizer": "sgd", "learning_rate": 0.1, "clipnorm": 0.5},
    ),
    optimizer_case(
        "sgd_clipvalue",
        lambda: O.SGD(learning_rate=0.1, clipvalue=0.3),
        {"optimizer": "sgd", "learning_rate": 0.1, "clipvalue": 0.3},
    ),
    optimizer_case(
        "sgd_global_clipnorm",
        lambda: O.SGD(learning_rate=0.1, global_clipnorm=0.7),
        {"optimizer": "sgd", "learning_rate": 0.1, "global_clipnorm": 0.7},
    ),
    optimizer_case(
        "sgd_global_clipnorm_inactive",
        lambda: O.SGD(learning_rate=0.1, global_clipnorm=100.0),
        {"optimizer": "sgd", "learning_rate": 0.1, "global_clipnorm": 100.0},
    ),
    optimizer_case(
        "adam",
        lambda: O.Adam(learning_rate=0.01),
        {"optimizer": "adam", "learning_rate": 0.01},
        slots=["momentum", "velocity"],
    ),
    optimizer_case(
        "adam_clipnorm",
        lambda: O.Adam(learning_rate=0.01, clipnorm=0.5),
        {"optimizer": "adam", "learning_rate": 0.01, "clipnorm": 0.5},
        slots=["momentum", "velocity"],
    ),
    optimizer_case(
        "adamw",
        lambda: O.AdamW(learning_rate=0.01),
        {"optimizer": "adamw", "learning_rate": 0.01},
        slots=["momentum", "velocity"],
    ),
    optimizer_case(
        "adamw_decay_global_clipnorm",
        lambda: O.AdamW(learning_rate=0.01, weight_decay=0.1, global_clipnorm=0.5),
        {"optimizer": "adamw", "learning_rate": 0.01, "weight_decay": 0.1, "global_clipnorm": 0.5},
        slots=["momentum", "velocity"],
    ),
    optimizer_case(
        "rmsprop",
        rms(learning_rate=0.01),
        {"optimizer": "rmsprop", "learning_rate": 0.01},
        slots=["velocity"],
    ),
    optimizer_case(
        "rmsprop_momentum",
        rms(learning_rate=0.01, momentum=0.9),
        {"optimizer": "rmsprop", "learning_rate": 0.01, "momentum": 0.9},
        slots=["velocity", "momentum"],
    ),
    optimizer_case(
        "rmsprop_centered",
        rms(learning_rate=0.01, centered=True),
        {"optimizer": "rmsprop", "learning_rate": 0.01, "centered": True},
        slots=["velocity", "average_gradient"],
    ),
    optimizer_case(
        "rmsprop_centered_momentum_decay_clipvalue",
        rms(learning_rate=0.01, momentum=0.5, centered=True, rho=0.8, weight_decay=0.02, clipvalue=0.4),
        {
            "optimizer": "rmsprop",
            "learning_rate": 0.01,
            "momentum": 0.5,
            "centered": True,
            "rho": 0.8,
            "weight_decay": 0.02,
            "clipvalue": 0.4,
        },
        slots=["velocity", "momentum", "average_gradient"],
    ),
    optimizer_case(
        "sgd_exponential_decay",
        lambda: O.SGD(learning_rate=S.ExponentialDecay(0.1, 2, 0.5), momentum=0.5),
        {"optimizer": "sgd", "momentum": 0.5, "schedule": "exponential", "initial_learning_rate": 0.1,
         "decay_steps": 2, "decay_rate": 0.5},
        slots=["momentum"],
    ),
    optimizer_case(
        "adam_piecewise_weight_decay",
        lambda: O.Adam(learning_rate=S.PiecewiseConstantDecay([0, 1], [0.1, 0.05, 0.01]), weight_decay=0.1),
        {"optimizer": "adam", "schedule": "piecewise", "boundaries": [0, 1], "values": [0.1, 0.05, 0.01],
         "weight_decay": 0.1},
        slots=["momentum", "velocity"],
    ),
]
