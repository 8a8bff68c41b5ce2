// Direct stride-1 2-D convolution (NHWC activations, HWIO kernels) and its gradients.
//
// Every entry point is a correlation between an input [n, h, w, ci] and an output
// [n, oh, ow, co]: out[n, i, j, o] = Σ_{a, b, c} in[n, i + a - pt, j + b - pl, c] · K(a, b, c, o),
// out-of-range inputs reading as zero.
//   forward         in = x, out = y, K(a, b, c, o) = k[a, b, c, o]; bias + activation fused.
//   backward input  in = dz ([.., c_out]), out = dx ([.., c_in]), padding (kh-1-pt, kw-1-pl),
//                   K(a, b, o, c) = k[kh-1-a, kw-1-b, c, o] (flip = 1).
//   backward kernel dk[a, b, c, o] = Σ_{n, i, j} x[n, i + a - pt, j + b - pl, c] · dz[n, i, j, o],
//                   partial sums over chunks of output pixels; the caller sums the partials
//                   (Kernels::sum_rows over [chunks, kh*kw*c_in*c_out]).
// Loads dominate the cost (on software rasterizers each non-uniform load is a per-lane loop), so
// every entry point is register blocked: each invocation keeps a small block of outputs in
// registers and reads each operand once per block. Out-of-range taps read a clamped, valid
// address and are zeroed with select (no divergent control flow in the loops).
//
// Entry points (all @workgroup_size(64); the "items" dimension is folded as grid_1d(items, 64):
// flat item = gid.x + gid.y * num_workgroups.x * 64):
//   conv2d_s     any co; 4 output pixels along a row × 4 output channels (scalar) per invocation.
//                flip 0 (forward, bias + act) or 1 (backward input, no bias, act 0).
//                items = n*oh*wblocks (wblocks = ceil(ow/4)); dispatch
//                (grid_1d(items).x, grid_1d(items).y, ceil(co/4)).
//                bindings: x (in: x, or dz when flip), k, bias, y (out: y, or dx when flip).
//   conv2d_v4    forward, co % 4 == 0: 4 pixels × 16 output channels (4 vec4) per invocation;
//                dispatch (.., .., ceil(co/16)). bindings: x, k4, bias4, y4.
//   conv2d_dx_v4 backward input when the forward c_out (here ci) % 4 == 0: 4 pixels × 4 input
//                channels, reducing over vec4s of the forward output channels;
//                dispatch (.., .., ceil(co/4)). bindings: dx (out), k4, dz4 (in).
//   conv2d_dk_s  backward kernel, any c_out: an invocation (unit) owns 4 consecutive flattened
//                taps r = (a*kw + b)*c_in + c × 4 output channels and sums over the output pixels
//                [gid.y * chunk, min(.. + chunk, pixels)); units = ceil(R/4) * ceil(co/4);
//                dispatch (ceil(units/64), chunks, 1); partial row gid.y of [chunks, R*co].
//                bindings: x, dz, dk (partials).
//   conv2d_dk_v4 backward kernel, c_out % 4 == 0: 4 taps × 16 output channels (4 vec4);
//                units = ceil(R/4) * ceil(co/16). bindings: x, dz4, dk4 (partials).
// Bindings (group 0): 0 uniform Params; 1 x, 2 k, 3 bias, 4 y, 5 dz, 6 dx, 7 dk: array<f32>;
// 8 k4, 9 bias4, 10 y4, 11 dz4, 12 dk4: array<vec4<f32>> views (element counts multiple of 4).
// All storage is read_write: two tensors of one dispatch may be ranges of one arena buffer.
// Tensors are bound to the USED bindings in ascending order (see each entry point).
// Params: in the correlation's terms (ci/co are the correlation's channels; for dk ci = c_in,
// co = c_out of the forward op). act 0 linear, 1 relu, 2 selu.
// Limits: four storage buffers, no workgroup memory, no f16 or subgroups (GL-compatible).

struct Params {
    n: u32,
    h: u32,
    w: u32,
    ci: u32,
    co: u32,
    kh: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    pt: u32,
    pl: u32,
    act: u32,
    has_bias: u32,
    flip: u32,
    wblocks: u32,
    items: u32,
    chunk: u32,
    pixels: u32,
    taps: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> dz: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;
@group(0) @binding(8) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> bias4: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> dz4: array<vec4<f32>>;
@group(0) @binding(12) var<storage, read_write> dk4: array<vec4<f32>>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

fn act4(v: vec4<f32>, kind: u32) -> vec4<f32> {
    switch kind {
        case 1u: { return max(v, vec4<f32>(0.0)); }
        case 2u: {
            return select(SELU_SCALE * SELU_ALPHA * (exp(v) - 1.0), SELU_SCALE * v, v > vec4<f32>(0.0));
        }
        default: { return v; }
    }
}

fn item_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Where an invocation of the pixel-blocked kernels works: image n, output row i, first column j0.
struct Block {
    n: u32,
    i: u32,
    j0: u32,
}

fn block_of(item: u32) -> Block {
    let it = min(item, p.items - 1u);
    let jb = it % p.wblocks;
    let t = it / p.wblocks;
    return Block(t / p.oh, t % p.oh, jb * 4u);
}

// Per tap (a, b) of a 4-pixel block: the x element offsets (times ci) of the 4 pixels (clamped
// to valid positions) and which of them are inside the input.
struct Taps {
    base: vec4<u32>,
    valid: vec4<bool>,
}

fn taps_of(blk: Block, a: u32, b: u32) -> Taps {
    // u32 arithmetic wraps, so negative positions become huge and fail the `< h` tests.
    let ii = blk.i + a - p.pt;
    let row = (blk.n * p.h + min(ii, p.h - 1u)) * p.w;
    let jj = vec4<u32>(blk.j0) + vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(b - p.pl);
    let valid = (jj < vec4<u32>(p.w)) & vec4<bool>(ii < p.h);
    let base = (vec4<u32>(row) + min(jj, vec4<u32>(p.w - 1u))) * p.ci;
    return Taps(base, valid);
}

fn load_x4(t: Taps, c: u32) -> vec4<f32> {
    let v = vec4<f32>(x[t.base.x + c], x[t.base.y + c], x[t.base.z + c], x[t.base.w + c]);
    return select(vec4<f32>(0.0), v, t.valid);
}

// ---------------------------------------------------------------------------------------------
// conv2d_s: any channel counts, forward (flip 0: x = x, y = y) or backward input (flip 1:
// dz bound as x, dx as y).

fn corr_s(blk: Block, oc: vec4<u32>) -> array<vec4<f32>, 4> {
    // acc[q][m]: pixel q, output channel oc[m].
    var acc: array<vec4<f32>, 4>;
    let flip = p.flip == 1u;
    let s_ci = select(p.co, 1u, flip);
    let s_co = select(1u, p.ci, flip);
    let koff = oc * s_co;
    for (var a = 0u; a < p.kh; a++) {
        let ka = select(a, p.kh - 1u - a, flip);
        for (var b = 0u; b < p.kw; b++) {
            let kb = select(b, p.kw - 1u - b, flip);
            let t = taps_of(blk, a, b);
            let kbase = (ka * p.kw + kb) * p.ci * p.co;
            for (var c = 0u; c < p.ci; c++) {
                let kr = kbase + c * s_ci;
                let kv = vec4<f32>(k[kr + koff.x], k[kr + koff.y], k[kr + koff.z], k[kr + koff.w]);
                let xv = load_x4(t, c);
                acc[0] += xv.x * kv;
                acc[1] += xv.y * kv;
                acc[2] += xv.z * kv;
                acc[3] += xv.w * kv;
            }
        }
    }
    return acc;
}

fn store_s(blk: Block, q: u32, oc0: u32, v: vec4<f32>) {
    let j = blk.j0 + q;
    if (j >= p.ow) { return; }
    var r = v;
    if (p.has_bias == 1u) {
        let bc = min(vec4<u32>(oc0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.co - 1u));
        r += vec4<f32>(bias[bc.x], bias[bc.y], bias[bc.z], bias[bc.w]);
    }
    r = act4(r, p.act);
    let base = ((blk.n * p.oh + blk.i) * p.ow + j) * p.co + oc0;
    let left = p.co - oc0;
    y[base] = r.x;
    if (left > 1u) { y[base + 1u] = r.y; }
    if (left > 2u) { y[base + 2u] = r.z; }
    if (left > 3u) { y[base + 3u] = r.w; }
}

@compute @workgroup_size(64)
fn conv2d_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let blk = block_of(item);
    let oc0 = gid.z * 4u;
    let oc = min(vec4<u32>(oc0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.co - 1u));
    let acc = corr_s(blk, oc);
    if (item >= p.items) { return; }
    store_s(blk, 0u, oc0, acc[0]);
    store_s(blk, 1u, oc0, acc[1]);
    store_s(blk, 2u, oc0, acc[2]);
    store_s(blk, 3u, oc0, acc[3]);
}

// ---------------------------------------------------------------------------------------------
// conv2d_v4: forward with co % 4 == 0; 4 pixels × 4 vec4 of output channels.

fn store_v4(blk: Block, q: u32, ob: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
    let j = blk.j0 + q;
    if (j >= p.ow) { return; }
    let co4 = p.co / 4u;
    let base = ((blk.n * p.oh + blk.i) * p.ow + j) * co4 + ob;
    let hb = p.has_bias == 1u;
    let last = co4 - 1u;
    var b0 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    if (hb) {
        b0 = bias4[min(ob, last)];
        b1 = bias4[min(ob + 1u, last)];
        b2 = bias4[min(ob + 2u, last)];
        b3 = bias4[min(ob + 3u, last)];
    }
    y4[base] = act4(a0 + b0, p.act);
    if (ob + 1u < co4) { y4[base + 1u] = act4(a1 + b1, p.act); }
    if (ob + 2u < co4) { y4[base + 2u] = act4(a2 + b2, p.act); }
    if (ob + 3u < co4) { y4[base + 3u] = act4(a3 + b3, p.act); }
}

@compute @workgroup_size(64)
fn conv2d_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let blk = block_of(item);
    let co4 = p.co / 4u;
    let ob = gid.z * 4u;
    let last = co4 - 1u;
    let o = min(vec4<u32>(ob) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    // acc[q * 4 + r]: pixel q, output vec4 r.
    var acc: array<vec4<f32>, 16>;
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b);
            let kbase = (a * p.kw + b) * p.ci * co4;
            for (var c = 0u; c < p.ci; c++) {
                let kr = kbase + c * co4;
                let k0 = k4[kr + o.x];
                let k1 = k4[kr + o.y];
                let k2 = k4[kr + o.z];
                let k3 = k4[kr + o.w];
                let xv = load_x4(t, c);
                acc[0] += xv.x * k0;
                acc[1] += xv.x * k1;
                acc[2] += xv.x * k2;
                acc[3] += xv.x * k3;
                acc[4] += xv.y * k0;
                acc[5] += xv.y * k1;
                acc[6] += xv.y * k2;
                acc[7] += xv.y * k3;
                acc[8] += xv.z * k0;
                acc[9] += xv.z * k1;
                acc[10] += xv.z * k2;
                acc[11] += xv.z * k3;
                acc[12] += xv.w * k0;
                acc[13] += xv.w * k1;
                acc[14] += xv.w * k2;
                acc[15] += xv.w * k3;
            }
        }
    }
    if (item >= p.items) { return; }
    store_v4(blk, 0u, ob, acc[0], acc[1], acc[2], acc[3]);
    store_v4(blk, 1u, ob, acc[4], acc[5], acc[6], acc[7]);
    store_v4(blk, 2u, ob, acc[8], acc[9], acc[10], acc[11]);
    store_v4(blk, 3u, ob, acc[12], acc[13], acc[14], acc[15]);
}

// ---------------------------------------------------------------------------------------------
// conv2d_dx_v4: backward input with the forward c_out (= ci here) % 4 == 0. Reads dz as vec4s
// over the forward output channels and the kernel rows k[a, b, c, :] as vec4s, so each
// output is a sum of vec4 products.

fn dx_row(t: Taps, ci4: u32, o4: u32) -> array<vec4<f32>, 4> {
    // t.base is in units of ci (scalars); dz4 is indexed in vec4s.
    let b = t.base / 4u + vec4<u32>(o4);
    let z = vec4<f32>(0.0);
    return array<vec4<f32>, 4>(
        select(z, dz4[b.x], t.valid.x),
        select(z, dz4[b.y], t.valid.y),
        select(z, dz4[b.z], t.valid.z),
        select(z, dz4[b.w], t.valid.w),
    );
}

fn store_dx(blk: Block, q: u32, c0: u32, v: vec4<f32>) {
    let j = blk.j0 + q;
    if (j >= p.ow) { return; }
    let base = ((blk.n * p.oh + blk.i) * p.ow + j) * p.co + c0;
    let left = p.co - c0;
    dx[base] = v.x;
    if (left > 1u) { dx[base + 1u] = v.y; }
    if (left > 2u) { dx[base + 2u] = v.z; }
    if (left > 3u) { dx[base + 3u] = v.w; }
}

@compute @workgroup_size(64)
fn conv2d_dx_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let blk = block_of(item);
    let ci4 = p.ci / 4u;
    let c0 = gid.z * 4u;
    let cc = min(vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.co - 1u));
    // acc[q * 4 + m]: pixel q, dx channel cc[m], as a vec4 of partial sums over o.
    var acc: array<vec4<f32>, 16>;
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b);
            // Flipped tap of the forward kernel; its rows k[ka, kb, c, :] are ci4 vec4s long.
            let tap = (p.kh - 1u - a) * p.kw + (p.kw - 1u - b);
            let kr = (vec4<u32>(tap * p.co) + cc) * ci4;
            for (var o4 = 0u; o4 < ci4; o4++) {
                let d = dx_row(t, ci4, o4);
                let k0 = k4[kr.x + o4];
                let k1 = k4[kr.y + o4];
                let k2 = k4[kr.z + o4];
                let k3 = k4[kr.w + o4];
                acc[0] += d[0] * k0;
                acc[1] += d[0] * k1;
                acc[2] += d[0] * k2;
                acc[3] += d[0] * k3;
                acc[4] += d[1] * k0;
                acc[5] += d[1] * k1;
                acc[6] += d[1] * k2;
                acc[7] += d[1] * k3;
                acc[8] += d[2] * k0;
                acc[9] += d[2] * k1;
                acc[10] += d[2] * k2;
                acc[11] += d[2] * k3;
                acc[12] += d[3] * k0;
                acc[13] += d[3] * k1;
                acc[14] += d[3] * k2;
                acc[15] += d[3] * k3;
            }
        }
    }
    if (item >= p.items) { return; }
    let one = vec4<f32>(1.0);
    store_dx(blk, 0u, c0, vec4<f32>(dot(acc[0], one), dot(acc[1], one), dot(acc[2], one), dot(acc[3], one)));
    store_dx(blk, 1u, c0, vec4<f32>(dot(acc[4], one), dot(acc[5], one), dot(acc[6], one), dot(acc[7], one)));
    store_dx(blk, 2u, c0, vec4<f32>(dot(acc[8], one), dot(acc[9], one), dot(acc[10], one), dot(acc[11], one)));
    store_dx(blk, 3u, c0, vec4<f32>(dot(acc[12], one), dot(acc[13], one), dot(acc[14], one), dot(acc[15], one)));
}

// ---------------------------------------------------------------------------------------------
// Backward kernel: partial sums over chunks of output pixels.

// The 4 flattened taps r0..r0+3 (clamped to the last): their x offsets relative to an output
// pixel's own position (wrapping u32, in scalars) and their (a - pt, b - pl) shifts.
struct TapBlock {
    // ((a - pt) * w + (b - pl)) * ci + c, wrapping.
    off: vec4<u32>,
    // a - pt and b - pl, wrapping.
    da: vec4<u32>,
    db: vec4<u32>,
}

fn tap_block(r0: u32) -> TapBlock {
    let r = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.taps - 1u));
    let c = r % p.ci;
    let ab = r / p.ci;
    let a = ab / p.kw;
    let b = ab % p.kw;
    let da = a - vec4<u32>(p.pt);
    let db = b - vec4<u32>(p.pl);
    let off = (da * p.w + db) * p.ci + c;
    return TapBlock(off, da, db);
}

// Output pixel state for walking a chunk without divisions.
struct Walk {
    n: u32,
    i: u32,
    j: u32,
}

fn walk_start(start: u32) -> Walk {
    let t = start / p.ow;
    return Walk(t / p.oh, t % p.oh, start % p.ow);
}

fn walk_next(s: Walk) -> Walk {
    var r = s;
    r.j += 1u;
    if (r.j == p.ow) {
        r.j = 0u;
        r.i += 1u;
        if (r.i == p.oh) {
            r.i = 0u;
            r.n += 1u;
        }
    }
    return r;
}

fn x_taps(s: Walk, tb: TapBlock) -> vec4<f32> {
    let ii = vec4<u32>(s.i) + tb.da;
    let jj = vec4<u32>(s.j) + tb.db;
    let valid = (ii < vec4<u32>(p.h)) & (jj < vec4<u32>(p.w));
    let at = min(vec4<u32>(((s.n * p.h + s.i) * p.w + s.j) * p.ci) + tb.off,
                 vec4<u32>(arrayLength(&x) - 1u));
    let v = vec4<f32>(x[at.x], x[at.y], x[at.z], x[at.w]);
    return select(vec4<f32>(0.0), v, valid);
}

@compute @workgroup_size(64)
fn conv2d_dk_s(@builtin(global_invocation_id) gid: vec3<u32>) {
    let obs = (p.co + 3u) / 4u;
    let units = ((p.taps + 3u) / 4u) * obs;
    let unit = min(gid.x, units - 1u);
    let r0 = (unit / obs) * 4u;
    let o0 = (unit % obs) * 4u;
    let o = min(vec4<u32>(o0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.co - 1u));
    let tb = tap_block(r0);
    let start = gid.y * p.chunk;
    let end = min(start + p.chunk, p.pixels);
    // acc[m]: tap r0 + m, channels o.
    var acc: array<vec4<f32>, 4>;
    var s = walk_start(start);
    for (var pix = start; pix < end; pix++) {
        let xv = x_taps(s, tb);
        let zb = pix * p.co;
        let d = vec4<f32>(dz[zb + o.x], dz[zb + o.y], dz[zb + o.z], dz[zb + o.w]);
        acc[0] += xv.x * d;
        acc[1] += xv.y * d;
        acc[2] += xv.z * d;
        acc[3] += xv.w * d;
        s = walk_next(s);
    }
    if (gid.x >= units) { return; }
    let row = gid.y * p.taps * p.co;
    for (var m = 0u; m < 4u; m++) {
        if (r0 + m >= p.taps) { break; }
        let base = row + (r0 + m) * p.co + o0;
        var v: vec4<f32>;
        switch m {
            case 0u: { v = acc[0]; }
            case 1u: { v = acc[1]; }
            case 2u: { v = acc[2]; }
            default: { v = acc[3]; }
        }
        let left = p.co - o0;
        dk[base] = v.x;
        if (left > 1u) { dk[base + 1u] = v.y; }
        if (left > 2u) { dk[base + 2u] = v.z; }
        if (left > 3u) { dk[base + 3u] = v.w; }
    }
}

fn store_dk4(row: u32, r: u32, ob: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
    if (r >= p.taps) { return; }
    let co4 = p.co / 4u;
    let base = row + r * co4 + ob;
    dk4[base] = a0;
    if (ob + 1u < co4) { dk4[base + 1u] = a1; }
    if (ob + 2u < co4) { dk4[base + 2u] = a2; }
    if (ob + 3u < co4) { dk4[base + 3u] = a3; }
}

@compute @workgroup_size(64)
fn conv2d_dk_v4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let co4 = p.co / 4u;
    let obs = (co4 + 3u) / 4u;
    let units = ((p.taps + 3u) / 4u) * obs;
    let unit = min(gid.x, units - 1u);
    let r0 = (unit / obs) * 4u;
    let ob = (unit % obs) * 4u;
    let o = min(vec4<u32>(ob) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(co4 - 1u));
    let tb = tap_block(r0);
    let start = gid.y * p.chunk;
    let end = min(start + p.chunk, p.pixels);
    // acc[m * 4 + q]: tap r0 + m, output vec4 ob + q.
    var acc: array<vec4<f32>, 16>;
    var s = walk_start(start);
    for (var pix = start; pix < end; pix++) {
        let xv = x_taps(s, tb);
        let zb = pix * co4;
        let d0 = dz4[zb + o.x];
        let d1 = dz4[zb + o.y];
        let d2 = dz4[zb + o.z];
        let d3 = dz4[zb + o.w];
        acc[0] += xv.x * d0;
        acc[1] += xv.x * d1;
        acc[2] += xv.x * d2;
        acc[3] += xv.x * d3;
        acc[4] += xv.y * d0;
        acc[5] += xv.y * d1;
        acc[6] += xv.y * d2;
        acc[7] += xv.y * d3;
        acc[8] += xv.z * d0;
        acc[9] += xv.z * d1;
        acc[10] += xv.z * d2;
        acc[11] += xv.z * d3;
        acc[12] += xv.w * d0;
        acc[13] += xv.w * d1;
        acc[14] += xv.w * d2;
        acc[15] += xv.w * d3;
        s = walk_next(s);
    }
    if (gid.x >= units) { return; }
    let row = gid.y * p.taps * co4;
    store_dk4(row, r0, ob, acc[0], acc[1], acc[2], acc[3]);
    store_dk4(row, r0 + 1u, ob, acc[4], acc[5], acc[6], acc[7]);
    store_dk4(row, r0 + 2u, ob, acc[8], acc[9], acc[10], acc[11]);
    store_dk4(row, r0 + 3u, ob, acc[12], acc[13], acc[14], acc[15]);
}
