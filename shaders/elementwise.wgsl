// Element-wise kernels: binary ops with bias-style broadcasting, scaling, fills, activations.
//
// Entry points (all @workgroup_size(256), 1-D over `n` elements; dispatch
// grid_1d(n, 256): x = min(groups, 65535), y = ceil(groups / 65535); flat index
// i = gid.x + gid.y * num_workgroups.x * 256):
//   binary              out[i] = a[i] (op) b[i % m]           bindings a, b, out
//   scale               out[i] = alpha * a[i]                  bindings a, out
//   activation          out[i] = act(a[i])                     bindings a, out
//   activation_backward out[i] = dact(b[i] = dy, a[i] = y)     bindings a (y), b (dy), out
//   activation_backward_v4  the same, n % 4 == 0, 4 vec4 (16 elements) per invocation:
//                       dispatch grid_1d(ceil(n / 16), 256)    bindings a4, b4, out4
//                       (software adapters run one scalar element per invocation at a
//                       fraction of their bandwidth)
//   copy_range          out[act + i] = a[m + i], i < n         bindings a, out
//                       (a copy between two ranges of one buffer, which copy_buffer_to_buffer
//                       refuses; m and act carry the source and destination offsets)
//   unscale_flag        out[i] = alpha * a[i], and b[0] = 1 when some a[i] is infinite or NaN,
//                       else b is untouched (the caller zeroes it; several tensors may flag one
//                       word): loss scaling's unscale and check in one pass  bindings a, b, out
//
// Bindings (group 0): 0 uniform Params; 1 a, 2 b, 3 out: storage read_write array<f32>, flat;
// 4 a4, 5 b4, 6 out4: the same as array<vec4<f32>> (bound sizes are multiples of 16 bytes).
// All storage is read_write: two tensors of one dispatch may be ranges of one arena buffer.
// Params: n elements, m = length of b (broadcast period, m divides n), op (0 add, 1 sub,
// 2 mul), act (0 linear, 1 relu, 2 selu), alpha.
// Limits: three storage buffers per stage.

struct Params {
    n: u32,
    m: u32,
    op: u32,
    act: u32,
    alpha: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> a4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

fn act(x: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return max(x, 0.0); }
        case 2u: {
            if (x > 0.0) { return SELU_SCALE * x; }
            return SELU_SCALE * SELU_ALPHA * (exp(x) - 1.0);
        }
        default: { return x; }
    }
}

// The derivative expressed through the activation's output y (what the forward pass kept).
fn act_grad(dy: f32, y: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return select(0.0, dy, y > 0.0); }
        case 2u: { return select(dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE, y > 0.0); }
        default: { return dy; }
    }
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let x = a[i];
    let y = b[i % p.m];
    var r: f32;
    switch p.op {
        case 0u: { r = x + y; }
        case 1u: { r = x - y; }
        default: { r = x * y; }
    }
    out[i] = r;
}

@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = p.alpha * a[i];
}

@compute @workgroup_size(256)
fn activation(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = act(a[i], p.act);
}

@compute @workgroup_size(256)
fn activation_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = act_grad(b[i], a[i], p.act);
}

fn act_grad4(dy: vec4<f32>, y: vec4<f32>, kind: u32) -> vec4<f32> {
    switch kind {
        case 1u: { return select(vec4<f32>(0.0), dy, y > vec4<f32>(0.0)); }
        case 2u: {
            return select(dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE, y > vec4<f32>(0.0));
        }
        default: { return dy; }
    }
}

@compute @workgroup_size(256)
fn activation_backward_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n4 = p.n / 4u;
    let i0 = flat(gid, nwg) * 4u;
    for (var q = 0u; q < 4u; q++) {
        let i = i0 + q;
        if (i < n4) {
            out4[i] = act_grad4(b4[i], a4[i], p.act);
        }
    }
}

@compute @workgroup_size(256)
fn copy_range(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    out[p.act + i] = a[p.m + i];
}

@compute @workgroup_size(256)
fn unscale_flag(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let x = a[i];
    out[i] = p.alpha * x;
    // The exponent bits rather than x != x: WGSL lets a compiler assume floats are finite.
    if ((bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u) {
        b[0] = 1.0;
    }
}
