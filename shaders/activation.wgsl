// Element-wise activations run by their own kernel (Keras' activations beyond the linear, relu
// and selu that the products fuse), forward and backward, in forms that stay accurate over the
// whole float32 range: no exp() of a positive argument that could overflow, no 1 - (x near 1).
//
// Entry points (both @workgroup_size(256), 1-D over `n` elements; dispatch grid_1d(n, 256):
// x = min(groups, 65535), y = ceil(groups / 65535); flat index i = gid.x + gid.y * nwg.x * 256):
//   act_fwd   out[i] = f(a[i])                                   bindings a, out
//   act_bwd   out[i] = b[i] * f'(.) where a[i] is the activation's input x (from_output = 0)
//             or its output y (from_output = 1; only the kinds whose derivative follows from
//             y: relu without threshold and with no clip or a clip at 6, elu, selu, sigmoid,
//             tanh, softplus)                                   bindings a, b (dy), out
//
// Bindings (group 0): 0 uniform Params; 1 a, 2 b, 3 out: storage read_write array<f32>, flat.
// All storage is read_write: two tensors of one dispatch may be ranges of one arena buffer.
// Params: n elements; kind (0 linear, 1 relu (Keras' general relu: slope, max, threshold),
// 2 elu, 3 selu, 4 gelu (exact, erfc), 5 gelu (tanh approximation), 6 sigmoid, 7 tanh,
// 8 swish, 9 softplus); from_output; has_max (relu's max_value is set); slope, max_value,
// threshold (relu).
// Derivatives at the kinks are TensorFlow's (ReluGrad, Relu6Grad, LeakyReluGrad, EluGrad,
// clip_by_value's gradient).
// Limits: three storage buffers per stage; f32 arithmetic (the float16 twin widens its loads).

struct Params {
    n: u32,
    kind: u32,
    from_output: u32,
    has_max: u32,
    slope: f32,
    max_value: f32,
    threshold: f32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;
const FRAC_1_SQRT_2: f32 = 0.7071067811865476;
const FRAC_1_SQRT_2PI: f32 = 0.3989422804014327;
const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const GELU_COEFF: f32 = 0.044715;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

// e^x - 1 with relative accuracy near 0: the Taylor series to x^9 / 9! below |x| = 0.5 (its
// remainder is under 1e-9 relative there), e^x - 1 above (no cancellation: |e^x - 1| > 0.39).
fn expm1(x: f32) -> f32 {
    if (abs(x) < 0.5) {
        var t = 1.0 + x * (1.0 / 9.0);
        t = 1.0 + x * t * (1.0 / 8.0);
        t = 1.0 + x * t * (1.0 / 7.0);
        t = 1.0 + x * t * (1.0 / 6.0);
        t = 1.0 + x * t * (1.0 / 5.0);
        t = 1.0 + x * t * (1.0 / 4.0);
        t = 1.0 + x * t * (1.0 / 3.0);
        t = 1.0 + x * t * (1.0 / 2.0);
        return x * t;
    }
    return exp(x) - 1.0;
}

// log(1 + u) for u in [0, 1]: 2 atanh(s), s = u / (2 + u) <= 1/9 below u = 0.25 (five odd
// terms: the remainder s^11 / 11 is under 1e-11), log(1 + u) above.
fn log1p_unit(u: f32) -> f32 {
    if (u < 0.25) {
        let s = u / (2.0 + u);
        let s2 = s * s;
        return 2.0 * s * (1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0)))));
    }
    return log(1.0 + u);
}

// 1 / (1 + e^-x), from e^-|x| so that nothing overflows.
fn sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    let s = 1.0 / (1.0 + e);
    return select(e * s, s, x >= 0.0);
}

// (σ(x), 1 - σ(x)), each to a few ulps: the complement is not formed by a subtraction, so
// derivatives σ(1 - σ) stay accurate in both tails.
fn sigmoid_pair(x: f32) -> vec2<f32> {
    let e = exp(-abs(x));
    let r = 1.0 / (1.0 + e);
    return select(vec2<f32>(e * r, r), vec2<f32>(r, e * r), x >= 0.0);
}

// tanh(x) = sign(x) * -expm1(-2|x|) / (2 + expm1(-2|x|)): accurate near 0, exactly ±1 far out.
fn tanh_stable(x: f32) -> f32 {
    let t = expm1(-2.0 * abs(x));
    return sign(x) * (-t / (2.0 + t));
}

// e^(-x²/2) without the rounding of x² in the exponent: x = hi + lo with hi's low 12 mantissa
// bits cleared, so hi² is exact and e^(-hi²/2) e^(-lo (x + hi) / 2) loses only the two exps'.
// `extra` is added to the second exponent (it is small).
fn exp_neg_half_sq(x: f32, extra: f32) -> f32 {
    let ax = abs(x);
    let hi = bitcast<f32>(bitcast<u32>(ax) & 0xfffff000u);
    let lo = ax - hi;
    return exp(-0.5 * hi * hi) * exp(-0.5 * lo * (ax + hi) + extra);
}

// Φ(x) = erfc(-x / √2) / 2 to about 1e-7 relative everywhere, the tails included: erfc(z) for
// z >= 0 as t e^(-z² + P(t)), t = 1 / (1 + z / 2), P the Chebyshev fit of Numerical Recipes'
// erfcc (fractional error < 1.2e-7), with z² = x² / 2 split as in exp_neg_half_sq.
fn normal_cdf(x: f32) -> f32 {
    let z = abs(x) * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let tail = 0.5 * t * exp_neg_half_sq(x, poly);
    return select(1.0 - tail, tail, x < 0.0);
}

fn act_relu(x: f32) -> f32 {
    var pos = max(x, 0.0);
    if (p.threshold != 0.0) {
        pos = select(0.0, x, x > p.threshold);
    }
    if (p.has_max != 0u) {
        pos = min(pos, p.max_value);
    }
    // Without a slope, no `0 * inf` (NaN) at x = -inf: relu(-inf) = 0, as in TensorFlow.
    if (p.slope == 0.0) {
        return pos;
    }
    return pos - p.slope * max(p.threshold - x, 0.0);
}

fn act(x: f32) -> f32 {
    switch p.kind {
        case 1u: { return act_relu(x); }
        case 2u: { return select(expm1(x), x, x > 0.0); }
        case 3u: { return select(SELU_SCALE * SELU_ALPHA * expm1(x), SELU_SCALE * x, x > 0.0); }
        case 4u: { return x * normal_cdf(x); }
        // 0.5 x (1 + tanh(u)) = x σ(2u), which does not cancel for large negative x.
        case 5u: { return x * sigmoid(2.0 * SQRT_2_OVER_PI * (x + GELU_COEFF * x * x * x)); }
        case 6u: { return sigmoid(x); }
        case 7u: { return tanh_stable(x); }
        case 8u: { return x * sigmoid(x); }
        case 9u: { return max(x, 0.0) + log1p_unit(exp(-abs(x))); }
        default: { return x; }
    }
}

// relu'(x), TensorFlow's at the kinks.
fn relu_grad_x(x: f32) -> f32 {
    let six = p.has_max != 0u && p.max_value == 6.0 && p.threshold == 0.0;
    if (p.slope != 0.0 && p.has_max == 0u && p.threshold == 0.0) {
        return select(p.slope, 1.0, x > 0.0);
    }
    var pos = select(0.0, 1.0, x > p.threshold);
    if (six) {
        pos = select(0.0, 1.0, x > 0.0 && x < 6.0);
    } else if (p.has_max != 0u && x > p.max_value) {
        pos = 0.0;
    }
    return pos + select(0.0, p.slope, x < p.threshold);
}

// act'(x) from the input.
fn grad_x(x: f32) -> f32 {
    switch p.kind {
        case 1u: { return relu_grad_x(x); }
        case 2u: { return select(exp(x), 1.0, x > 0.0); }
        // SeluGrad's: scale at 0.
        case 3u: { return select(SELU_SCALE * SELU_ALPHA * exp(x), SELU_SCALE, x >= 0.0); }
        case 4u: { return normal_cdf(x) + x * FRAC_1_SQRT_2PI * exp_neg_half_sq(x, 0.0); }
        case 5u: {
            let s = sigmoid_pair(2.0 * SQRT_2_OVER_PI * (x + GELU_COEFF * x * x * x));
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_COEFF * x * x);
            return s.x + x * 2.0 * s.x * s.y * du;
        }
        case 6u: {
            let s = sigmoid_pair(x);
            return s.x * s.y;
        }
        // 1 - tanh² = 4 e / (1 + e)², e = e^(-2|x|): no cancellation in the tails.
        case 7u: {
            let e = exp(-2.0 * abs(x));
            let r = 1.0 / (1.0 + e);
            return 4.0 * e * r * r;
        }
        case 8u: {
            let s = sigmoid_pair(x);
            return s.x * (1.0 + x * s.y);
        }
        case 9u: { return sigmoid(x); }
        default: { return 1.0; }
    }
}

// act'(.) from the output y (kinds listed in the header).
fn grad_y(y: f32) -> f32 {
    switch p.kind {
        case 1u: {
            if (y > 0.0) {
                return select(1.0, 0.0, p.has_max != 0u && y >= p.max_value);
            }
            if (y < 0.0) { return p.slope; }
            // y = 0: x = 0 (or below, without a slope); leaky_relu passes its slope there.
            return select(0.0, p.slope, p.has_max == 0u);
        }
        case 2u: { return select(y + 1.0, 1.0, y > 0.0); }
        case 3u: { return select(y + SELU_SCALE * SELU_ALPHA, SELU_SCALE, y >= 0.0); }
        case 6u: { return y * (1.0 - y); }
        case 7u: { return (1.0 - y) * (1.0 + y); }
        // σ(x) = 1 - e^-y.
        case 9u: { return -expm1(-y); }
        default: { return 1.0; }
    }
}

@compute @workgroup_size(256)
fn act_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = act(a[i]);
}

@compute @workgroup_size(256)
fn act_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let t = a[i];
    var g: f32;
    if (p.from_output != 0u) {
        g = grad_y(t);
    } else {
        g = grad_x(t);
    }
    out[i] = b[i] * g;
}
