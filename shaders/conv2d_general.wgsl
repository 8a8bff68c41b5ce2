// General 2-D convolution: strides, dilation, TF's (possibly asymmetric) 'same' padding and
// groups, NHWC activations. What depthwise.wgsl (stride 1, tuned, register blocked) does not
// serve: DepthwiseConv2D with a depth multiplier, strides, dilation or 'valid' padding, and a
// depthwise convolution's forward pass with a fused bias and activation (a Conv2D, one group,
// takes conv2d.wgsl's kernels at any strides and dilation).
//
// A grouped convolution: output channel o belongs to group g = o / cog and reads input channels
// g*cig .. (g+1)*cig; the kernel is [kh, kw, cig, co] (a Conv2D: cig = ci, cog = co, one group;
// a depthwise convolution with multiplier m: cig = 1, cog = m, kernel [kh, kw, c, m] =
// [kh, kw, 1, c*m]). With r(i, a) = i*sh + a*dh - pt and c(j, b) = j*sw + b*dw - pl:
//   forward         y[n, i, j, o] = act(bias[o] + Σ_{a, b, q} x[n, r(i,a), c(j,b), g*cig + q] ·
//                   k[a, b, q, o]), out-of-range x reading as zero.
//   backward input  dx[n, r, c, g*cig + q] = Σ over (a, b, i, j) with r(i, a) = r, c(j, b) = c
//                   and o in group g of dz[n, i, j, o] · k[a, b, q, o].
//   backward kernel dk[a, b, q, o] = Σ_{n, i, j} x[n, r(i,a), c(j,b), g*cig + q] · dz[n, i, j, o],
//                   as partial sums over chunks of output pixels; the caller sums the
//                   [chunks, kh*kw*cig*co] partials (Kernels::sum_rows).
// One output element per invocation, plain loops: these shapes are not the tutorial's, and a
// general kernel that is simple to check beats a fast one for each case.
//
// Entry points (all @workgroup_size(64); items folded as grid_1d(items, 64): flat item =
// gid.x + gid.y * num_workgroups.x * 64):
//   conv_general_fwd  items = n*oh*ow*co (o fastest). bindings x, k, bias, y (without a bias,
//                     p.has_bias = 0 and any tensor is bound there; it is not read).
//   conv_general_dx   items = n*h*w*ci (channel fastest). bindings k, dz, dx.
//   conv_general_dk   items = chunks * klen (klen = kh*kw*cig*co, the kernel element fastest);
//                     item = chunk * klen + e sums output pixels [chunk * p.chunk, .. + p.chunk)
//                     ∩ [0, n*oh*ow) into partial row `chunk`. bindings x, dz, dk.
// Bindings (group 0): 0 uniform Params; 1 x, 2 k, 3 bias, 4 y, 5 dz, 6 dx, 7 dk: array<f32>,
// read_write (ranges of one buffer may meet in a dispatch). Tensors are bound to the used
// bindings in ascending order.
// Params: n, h, w, ci, co, cig, cog, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act (0 linear,
// 1 relu, 2 selu), has_bias, items, chunk, klen.
// Limits: every loop runs at most max(kh, kw, cig, cog, p.chunk) times (p.chunk below Mesa's
// 65,000-iteration cut); no f16 or subgroups (GL-compatible); the f16 twin keeps dk float32.

struct Params {
    n: u32,
    h: u32,
    w: u32,
    ci: u32,
    co: u32,
    cig: u32,
    cog: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    oh: u32,
    ow: u32,
    act: u32,
    has_bias: u32,
    items: u32,
    chunk: u32,
    klen: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> dz: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

fn act1(v: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return max(v, 0.0); }
        case 2u: {
            return select(SELU_SCALE * SELU_ALPHA * (exp(v) - 1.0), SELU_SCALE * v, v > 0.0);
        }
        default: { return v; }
    }
}

fn item_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

@compute @workgroup_size(64)
fn conv_general_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let o = item % p.co;
    let pix = item / p.co;
    let j = pix % p.ow;
    let t = pix / p.ow;
    let i = t % p.oh;
    let n = t / p.oh;
    let c0 = o / p.cog * p.cig;
    var acc = 0.0;
    for (var a = 0u; a < p.kh; a++) {
        // u32 arithmetic wraps: a row above the image becomes huge and fails `< h`.
        let r = i * p.sh + a * p.dh - p.pt;
        if (r >= p.h) { continue; }
        for (var b = 0u; b < p.kw; b++) {
            let c = j * p.sw + b * p.dw - p.pl;
            if (c >= p.w) { continue; }
            let xb = ((n * p.h + r) * p.w + c) * p.ci + c0;
            let kb = (a * p.kw + b) * p.cig * p.co + o;
            for (var q = 0u; q < p.cig; q++) {
                acc += x[xb + q] * k[kb + q * p.co];
            }
        }
    }
    if (p.has_bias == 1u) {
        acc += bias[o];
    }
    y[item] = act1(acc, p.act);
}

@compute @workgroup_size(64)
fn conv_general_dx(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let ch = item % p.ci;
    let pix = item / p.ci;
    let cc = pix % p.w;
    let t = pix / p.w;
    let r = t % p.h;
    let n = t / p.h;
    let g = ch / p.cig;
    let q = ch % p.cig;
    var acc = 0.0;
    for (var a = 0u; a < p.kh; a++) {
        // Output row i with i*sh + a*dh - pt = r, if any.
        let ti = i32(r + p.pt) - i32(a * p.dh);
        if (ti < 0 || u32(ti) % p.sh != 0u) { continue; }
        let i = u32(ti) / p.sh;
        if (i >= p.oh) { continue; }
        for (var b = 0u; b < p.kw; b++) {
            let tj = i32(cc + p.pl) - i32(b * p.dw);
            if (tj < 0 || u32(tj) % p.sw != 0u) { continue; }
            let j = u32(tj) / p.sw;
            if (j >= p.ow) { continue; }
            let zb = ((n * p.oh + i) * p.ow + j) * p.co + g * p.cog;
            let kb = ((a * p.kw + b) * p.cig + q) * p.co + g * p.cog;
            for (var e = 0u; e < p.cog; e++) {
                acc += dz[zb + e] * k[kb + e];
            }
        }
    }
    dx[item] = acc;
}

@compute @workgroup_size(64)
fn conv_general_dk(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let e = item % p.klen;
    let chunk = item / p.klen;
    let o = e % p.co;
    let t = e / p.co;
    let q = t % p.cig;
    let ab = t / p.cig;
    let b = ab % p.kw;
    let a = ab / p.kw;
    let ch = o / p.cog * p.cig + q;
    let pixels = p.n * p.oh * p.ow;
    let first = chunk * p.chunk;
    let last = min(first + p.chunk, pixels);
    var acc = 0.0;
    // The chunk's pixels walked without dividing: (n, i, j) of `first`, then one step each.
    var j = first % p.ow;
    let u = first / p.ow;
    var i = u % p.oh;
    var n = u / p.oh;
    for (var px = first; px < last; px++) {
        let r = i * p.sh + a * p.dh - p.pt;
        let c = j * p.sw + b * p.dw - p.pl;
        if (r < p.h && c < p.w) {
            acc += x[((n * p.h + r) * p.w + c) * p.ci + ch] * dz[px * p.co + o];
        }
        j += 1u;
        if (j == p.ow) {
            j = 0u;
            i += 1u;
            if (i == p.oh) {
                i = 0u;
                n += 1u;
            }
        }
    }
    dk[item] = acc;
}
