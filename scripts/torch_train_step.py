"""PyTorch's side of the GPU speed comparison: the training step of the tutorial CNN, or of the
modern one (`--model modern`).

The same model as `anygpu::nn::tutorial_cnn` and `scripts/tf_train_step.py` (184,234 parameters,
SELU, softmax cross-entropy, SGD at 0.01), or as `fashion_mnist --model modern` (Conv-BN-ReLU
blocks with strided 3x3 convolutions, global average pooling, Dropout, AdamW; 140,458
parameters and 640 BatchNorm statistics), in PyTorch's own layout (NCHW) as a PyTorch user
writes it. A step is forward, loss, backward, update and a synchronize; the batch is made on the
GPU once, before timing (`fashion_mnist --time-steps N` uploads each step's batch just before
the step, and the copy runs inside it: ours moves more).

    python3 scripts/torch_train_step.py --variant fp32 --batch 1024 --steps 30
    python3 scripts/torch_train_step.py --variant amp --batch 1024 --model modern

Variants:
    fp32     eager, TF32 off for matmuls and cuDNN: the like-for-like row against anygpu's f32
    default  eager with PyTorch's defaults (cuDNN may use TF32 for convolutions)
    amp      torch.autocast(float16) with torch.amp.GradScaler: against `--mixed-precision`
    graph    the whole default step captured in one CUDA graph and replayed: the bound with no
             launch overhead
    compile  torch.compile(model) (default mode), eager otherwise; the first steps compile

Needs a CUDA device: without one it exits with an error rather than time the CPU. Warms up for
at least 5 steps and 1 s after the first step (as ours does), times each step with a synchronize after it, then the
same steps back to back (one synchronize at the end, as a training loop runs). Prints two
lines, `torch <variant> median train step: X ms (<model>, batch B, ...)` and `torch <variant>
back-to-back train step: Y ms (...)`, which scripts/gpu_check.sh collects into its table. Run each variant in a process of its own (the
check does, under a timeout): TF32 and compile settings are process-wide.
"""

import argparse
import statistics
import time

import torch
from torch import nn


class SeparableConv2d(nn.Module):
    """Keras' SeparableConv2D(filters, 3, padding="same"): depthwise without bias, then 1x1."""

    def __init__(self, c_in, filters):
        super().__init__()
        self.depthwise = nn.Conv2d(c_in, c_in, 3, padding=1, groups=c_in, bias=False)
        self.pointwise = nn.Conv2d(c_in, filters, 1)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


def tutorial_cnn():
    selu = nn.SELU
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        selu(),
        SeparableConv2d(32, 32),
        selu(),
        nn.MaxPool2d(2),
        SeparableConv2d(32, 64),
        selu(),
        SeparableConv2d(64, 64),
        selu(),
        nn.MaxPool2d(2),
        SeparableConv2d(64, 128),
        selu(),
        SeparableConv2d(128, 128),
        selu(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(1152, 128),
        selu(),
        # Logits: the softmax is fused into the loss, as anygpu and Keras do it.
        nn.Linear(128, 10),
    )


def modern_cnn():
    """examples/fashion_mnist/models.rs's modern CNN. PyTorch pads a strided 3x3 convolution
    1 and 1 where Keras' 'same' pads 0 and 1: the same output shapes, the same work."""
    stack, c_in = [], 1
    for filters, stride in [(32, 1), (32, 2), (64, 1), (64, 2), (128, 1)]:
        stack += [
            nn.Conv2d(c_in, filters, 3, stride=stride, padding=1, bias=False),
            # Keras' defaults: epsilon 1e-3, momentum 0.99 (PyTorch's momentum is 1 - that).
            nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01),
            nn.ReLU(),
        ]
        c_in = filters
    stack += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(128, 10)]
    return nn.Sequential(*stack)


MODELS = {
    # name: (constructor, parameters, optimizer of (parameters, capturable in a CUDA graph))
    "tutorial": (tutorial_cnn, 184_234, lambda p, _: torch.optim.SGD(p, lr=0.01)),
    "modern": (
        modern_cnn,
        140_458,
        lambda p, graph: torch.optim.AdamW(p, lr=0.003, weight_decay=0.004, capturable=graph),
    ),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variant", choices=["fp32", "default", "amp", "graph", "compile"], default="fp32"
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="tutorial")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="at least this many warm-up steps")
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=1.0,
        help="and at least this long (an idle GPU raises its clocks only after some busy time)",
    )
    args = parser.parse_args()

    if not torch.cuda.is_available():
        # A CPU timing in the GPU table would pass for PyTorch's.
        raise SystemExit(f"torch {args.variant}: no CUDA device (torch {torch.__version__})")
    device = torch.device("cuda")
    if args.variant == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # what a PyTorch user training a fixed shape sets
    torch.manual_seed(0)

    build, want, make_optimizer = MODELS[args.model]
    model = build().to(device)
    params = sum(p.numel() for p in model.parameters())
    assert params == want, f"{params} parameters, not the {args.model} model's {want:,}"
    optimizer = make_optimizer(model.parameters(), args.variant == "graph")
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    sync = torch.cuda.synchronize
    if args.variant == "compile":
        model = torch.compile(model)

    if args.variant == "amp":
        scaler = torch.amp.GradScaler(device.type)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    elif args.variant == "graph":
        # PyTorch's recipe for whole-network capture: warm up on a side stream, then capture
        # forward, backward and the update; replay runs the step as one launch.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()

        def step():
            graph.replay()

    else:

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()

    start = time.perf_counter()
    step()
    sync()
    first = (time.perf_counter() - start) * 1e3
    warm = time.perf_counter()
    done = 0
    while done < args.warmup or time.perf_counter() - warm < args.warmup_seconds:
        step()
        sync()
        done += 1
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    med = statistics.median(times)
    name = torch.cuda.get_device_name()
    print(
        f"torch {args.variant} median train step: {med:.2f} ms ({args.model}, batch {args.batch}, {name}, "
        f"torch {torch.__version__}; min {min(times):.2f}, max {max(times):.2f} over "
        f"{args.steps} steps; first step {first:.0f} ms; {args.batch / med * 1e3:.0f} images/s)"
    )
    # As a training loop runs: no synchronize between steps, one at the end.
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    per_step = (time.perf_counter() - start) * 1e3 / args.steps
    print(
        f"torch {args.variant} back-to-back train step: {per_step:.2f} ms ({args.steps} steps, "
        f"one synchronize at the end; {args.batch / per_step * 1e3:.0f} images/s)"
    )


if __name__ == "__main__":
    main()
