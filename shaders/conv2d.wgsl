// Direct 2-D convolution (NHWC activations, HWIO kernels, one group) and its gradients, at any
// strides and dilation.
//
// The main entry points are one correlation between an input [n, h, w, ci] and an output
// [n, oh, ow, co]: out[n, i, j, o] = Σ_{a, b, c} in↑[n, i·sh + a·dh - pt, j·sw + b·dw - pl, c] ·
// K[a, b, c, o], where in↑ is the input seen upsampled by (uh, uw) (in↑[r, s] = in[r/uh, s/uw]
// where both divide, zero between) and out-of-range inputs read as zero, with bias + activation
// fused into the store.
//   forward         in = x, out = y, K = k (uh = uw = 1).
//   backward input  in = dz ([.., c_out]) upsampled by the forward strides, out = dx ([..,
//                   c_in]), strides 1, the forward dilation, padding ((kh-1)·dh - pt,
//                   (kw-1)·dw - pl), K = the flipped, channel-swapped kernel from conv2d_flip (no
//                   bias, act 0).
//   backward kernel dk[a, b, c, o] = Σ_{n, i, j} x[n, i·sh + a·dh - pt, j·sw + b·dw - pl, c] ·
//                   dz[n, i, j, o], as partial sums over chunks of output pixels; the caller sums
//                   the partials (Kernels::sum_rows over [chunks, kh*kw*c_in*c_out]).
// Loads dominate the cost (on software rasterizers every non-uniform load is a per-lane loop), so
// the entry points are register blocked: each invocation keeps a block of outputs in registers
// and reads each operand once per block. Out-of-range taps read a clamped, valid address and are
// zeroed with select, so the loops have no divergent control flow (except over an upsampled
// input, where a block skips the taps that fall between the rows or columns of dz: three in
// four at strides 2×2).
//
// Entry points (@workgroup_size(64) unless noted; the "items" dimension is folded as
// grid_1d(items, 64): flat item = gid.x + gid.y * num_workgroups.x * 64):
//   conv2d_s     any co: 4 output pixels along a row × 4 output channels (scalar) per invocation;
//                items = n*oh*wblocks (p.wblocks = ceil(ow/4), or uw·ceil(ceil(ow/uw)/4) over
//                an upsampled input: `block_of`); dispatch (grid_1d(items).x,
//                grid_1d(items).y, ceil(co/4)). bindings x, k, bias, y.
//   conv2d_v4    co % 4 == 0: 4 output pixels × 32 output channels (8 vec4) per invocation;
//                items = n*oh*wblocks (as conv2d_s); dispatch (.., .., ceil(co/32)).
//                bindings x, k4, bias4, y4.
//   conv2d_smem_v4  co % 4 == 0, for GPUs: the correlation as an implicit matrix product
//                (m = n*oh*ow output pixels × k = kh*kw*ci taps × co; no im2col buffer) on
//                matmul_smem_v4's tiles: a workgroup (16, 16) computes 64 pixels × 64 output
//                channels, stepping 16 of k at a time through workgroup memory (the pixels'
//                taps gathered from x with the padding, the kernel rows as vec4), 4 pixels ×
//                one vec4 of channels per invocation; dispatch (ceil(co/64), ceil(m/64), 1).
//                bindings x, k4, bias4, y4.
//   conv2d_flip  @workgroup_size(256), dispatch grid_1d(items = kh*kw*ci*co, 256):
//                y[((a*kw + b)*co + o)*ci + c] = k[(((kh-1-a)*kw + kw-1-b)*ci + c)*co + o]
//                (params in the forward op's terms). bindings k, y.
//   conv2d_dk_s  backward kernel, any c_out: a unit owns 4 consecutive flattened taps
//                r = (a*kw + b)*c_in + c (R = p.taps = kh*kw*c_in of them) × 4 output channels;
//                units = ceil(R/4) * ceil(co/4). Item = chunk * units + unit sums over the
//                output pixels [chunk * p.chunk, .. + p.chunk) ∩ [0, p.pixels) into row `chunk`
//                of the partials [chunks, R*co]; items = units * chunks, dispatch
//                grid_1d(items, 64). bindings x, dz, dk (partials).
//   conv2d_dk_v4 backward kernel, c_out % 4 == 0: 8 taps × 16 output channels (4 vec4);
//                units = ceil(R/8) * ceil(co/16). bindings x, dz4, dk4 (partials).
//   conv2d_dk_1x1_16  conv2d_dk_1x1 with 16 output channels per unit (4 vec4 of dz), c_out
//                % 16 == 0: per pixel 8 vec4 loads feed 256 multiply-adds; units =
//                (ci/16) * (co/16). A tuning candidate (software adapters: fewer loads per
//                product; GPUs: twice the invocations with conv2d_dk_1x1).
//   conv2d_dk9_v4 conv2d_dk_v4 for exactly 9 taps (3×3 on one input channel): all 9 × 16
//                output channels in one unit; units = ceil(co/16). bindings x, dz4, dk4.
//   conv2d_dk_1x1 backward kernel of a stride-1 1×1 convolution (xᵀ · dz over the
//                pixels), c_in % 16 == 0 and c_out % 8 == 0: 16 input channels (4 vec4 of x) ×
//                8 output channels (2 vec4 of dz) per unit, so per pixel 6 vec4 loads feed 128
//                multiply-adds with no tap arithmetic; units = (ci/16) * (co/8).
//                bindings x4, dz4, dk4 (partials).
//   conv2d_c1_pack  @workgroup_size(256), dispatch grid_1d(items = co/8 * 72, 256): the kernel
//                [3, 3, 1, co] as conv2d_c1_ubo8's windows, one per block of 8 output channels,
//                128 floats (512 bytes, a uniform offset alignment) apart:
//                y[c * 128 + t * 8 + q] = k[t * co + 8c + q]. bindings k, y.
//   conv2d_c1_ubo8  forward of a 3×3 kernel on a one-channel input (a grayscale image's first
//                layer), co % 8 == 0, for software adapters: two neighbouring output pixels × one
//                block of 8 output channels per invocation, one dispatch per block (p.block), the block's
//                kernel window as a uniform buffer read at constant offsets. conv2d_v4 reads
//                the same taps and weights per lane (lavapipe loads storage buffers lane by
//                lane; these are 12 loads per 2 pixels instead of 288 weights per 4 pixels).
//                items = n*oh*wblocks (wblocks = ceil(ow/2)), dispatch grid_1d(items, 64) per
//                block.
//                bindings x, bias4, y4, kw8 (the window).
// Bindings (group 0): 0 uniform Params; 1 x, 2 k, 3 bias, 4 y, 5 dz, 7 dk: array<f32>;
// 6 x4, 8 k4, 9 bias4, 10 y4, 11 dz4, 12 dk4: array<vec4<f32>> views (element counts multiple
// of 4); 13 kw8, a uniform window (conv2d_c1_ubo8).
// All storage is read_write: two tensors of one dispatch may be ranges of one arena buffer.
// Tensors are bound to the USED bindings in ascending order (as listed per entry point).
// Params: in the correlation's terms (for backward input: h, w = the forward oh, ow; ci = c_out;
// co = c_in; oh, ow = the forward h, w); act 0 linear, 1 relu, 2 selu; has_bias; wblocks;
// items; chunk, pixels, taps (backward kernel); block (conv2d_c1_ubo8); strides sh, sw,
// dilation dh, dw and upsampling uh, uw (all 1 for a stride-1 correlation; conv2d_c1_ubo8 and
// conv2d_dk_1x1[_16] only run at 1, the backward kernel entry points never upsample).
// Limits: four storage buffers, 8 KiB of workgroup memory (conv2d_smem_v4), no f16 or subgroups
// (GL-compatible).

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
    sh: u32,
    wblocks: u32,
    items: u32,
    chunk: u32,
    pixels: u32,
    taps: u32,
    block: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    uh: u32,
    uw: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read_write> dz: array<f32>;
@group(0) @binding(6) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dk: array<f32>;
@group(0) @binding(8) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> bias4: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> dz4: array<vec4<f32>>;
@group(0) @binding(12) var<storage, read_write> dk4: array<vec4<f32>>;
// conv2d_c1_ubo8's window: one block of 8 output channels of a 3×3 one-channel kernel, tap-major
// (tap t's channels are vec4s 2t and 2t + 1).
@group(0) @binding(13) var<uniform> kw8: array<vec4<f32>, 18>;

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

// Where an invocation of the pixel-blocked kernels works: image n, output row i, its columns
// j0 + q·step. Over an input upsampled by uw (an input gradient at strides above 1) a block
// takes the columns of one phase j % uw, step uw apart (p.wblocks = uw · ceil(ceil(ow / uw) /
// width), the blocks of a row phase by phase, so neighbouring invocations mostly share theirs):
// a tap column then reads the input for all of a block's columns or for none, and the kernels
// skip the taps that read none.
struct Block {
    n: u32,
    i: u32,
    j0: u32,
    step: u32,
}

fn block_of(item: u32, width: u32) -> Block {
    let it = min(item, p.items - 1u);
    let jb = it % p.wblocks;
    let t = it / p.wblocks;
    if (p.uw == 1u) {
        return Block(t / p.oh, t % p.oh, jb * width, 1u);
    }
    let per_phase = p.wblocks / p.uw;
    let j0 = (jb % per_phase) * width * p.uw + jb / per_phase;
    return Block(t / p.oh, t % p.oh, j0, p.uw);
}

// Whether a tap reads nothing for any pixel of the block, over an upsampled input (elsewhere the
// kernels keep their loops free of divergent branches).
fn skipped(t: Taps) -> bool {
    return (p.uh != 1u || p.uw != 1u) && !any(t.valid);
}

// Per tap (a, b) of a 4-pixel block: the x element offsets (times ci) of the 4 pixels (clamped
// to valid positions) and which of them are inside the input.
struct Taps {
    base: vec4<u32>,
    valid: vec4<bool>,
}

fn taps_of(blk: Block, a: u32, b: u32, q0: u32) -> Taps {
    // u32 arithmetic wraps, so negative positions become huge and fail the `< h` tests.
    var ii = blk.i * p.sh + a * p.dh - p.pt;
    let j = vec4<u32>(blk.j0) + (vec4<u32>(q0) + vec4<u32>(0u, 1u, 2u, 3u)) * blk.step;
    var jj = j * p.sw + vec4<u32>(b * p.dw - p.pl);
    var on = vec4<bool>(true);
    // (Uniform: only an input gradient at strides above 1 pays the divisions.)
    if (p.uh != 1u || p.uw != 1u) {
        on = vec4<bool>(ii % p.uh == 0u) & (jj % vec4<u32>(p.uw) == vec4<u32>(0u));
        ii = ii / p.uh;
        jj = jj / vec4<u32>(p.uw);
    }
    let row = (blk.n * p.h + min(ii, p.h - 1u)) * p.w;
    let valid = (jj < vec4<u32>(p.w)) & vec4<bool>(ii < p.h) & on;
    let base = (vec4<u32>(row) + min(jj, vec4<u32>(p.w - 1u))) * p.ci;
    return Taps(base, valid);
}

fn load_x4(t: Taps, c: u32) -> vec4<f32> {
    let v = vec4<f32>(x[t.base.x + c], x[t.base.y + c], x[t.base.z + c], x[t.base.w + c]);
    return select(vec4<f32>(0.0), v, t.valid);
}

// ---------------------------------------------------------------------------------------------
// conv2d_s: any channel counts; 4 pixels × 4 output channels (scalar) per invocation.

fn corr_s(blk: Block, oc: vec4<u32>) -> array<vec4<f32>, 4> {
    // acc[q][m]: pixel q, output channel oc[m].
    var acc: array<vec4<f32>, 4>;
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b, 0u);
            if (skipped(t)) { continue; }
            let kbase = (a * p.kw + b) * p.ci * p.co;
            for (var c = 0u; c < p.ci; c++) {
                let kr = kbase + c * p.co;
                let kv = vec4<f32>(k[kr + oc.x], k[kr + oc.y], k[kr + oc.z], k[kr + oc.w]);
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
    let j = blk.j0 + q * blk.step;
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
    let blk = block_of(item, 4u);
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
// conv2d_v4: co % 4 == 0; 4 pixels × 8 vec4 of output channels per invocation: per tap and input
// channel 4 loads of x and 8 vec4 loads of the kernel (the same address in every lane: the
// channel block is the workgroup's z) feed 128 multiply-adds.

fn store_v4(blk: Block, q: u32, ob: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
    let j = blk.j0 + q * blk.step;
    let co4 = p.co / 4u;
    if (j >= p.ow || ob >= co4) { return; }
    let base = ((blk.n * p.oh + blk.i) * p.ow + j) * co4 + ob;
    let last = co4 - 1u;
    var b0 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    if (p.has_bias == 1u) {
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
    let blk = block_of(item, 4u);
    let co4 = p.co / 4u;
    let ob = gid.z * 8u;
    let last = co4 - 1u;
    let o0 = min(ob + 0u, last);
    let o1 = min(ob + 1u, last);
    let o2 = min(ob + 2u, last);
    let o3 = min(ob + 3u, last);
    let o4 = min(ob + 4u, last);
    let o5 = min(ob + 5u, last);
    let o6 = min(ob + 6u, last);
    let o7 = min(ob + 7u, last);
    // acc[q * 8 + r]: pixel q, output vec4 ob + r.
    var acc: array<vec4<f32>, 32>;
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b, 0u);
            if (skipped(t)) { continue; }
            let kbase = (a * p.kw + b) * p.ci * co4;
            for (var c = 0u; c < p.ci; c++) {
                let kr = kbase + c * co4;
                let kv0 = k4[kr + o0];
                let kv1 = k4[kr + o1];
                let kv2 = k4[kr + o2];
                let kv3 = k4[kr + o3];
                let kv4 = k4[kr + o4];
                let kv5 = k4[kr + o5];
                let kv6 = k4[kr + o6];
                let kv7 = k4[kr + o7];
                let xv = load_x4(t, c);
                acc[0] += xv.x * kv0;
                acc[1] += xv.x * kv1;
                acc[2] += xv.x * kv2;
                acc[3] += xv.x * kv3;
                acc[4] += xv.x * kv4;
                acc[5] += xv.x * kv5;
                acc[6] += xv.x * kv6;
                acc[7] += xv.x * kv7;
                acc[8] += xv.y * kv0;
                acc[9] += xv.y * kv1;
                acc[10] += xv.y * kv2;
                acc[11] += xv.y * kv3;
                acc[12] += xv.y * kv4;
                acc[13] += xv.y * kv5;
                acc[14] += xv.y * kv6;
                acc[15] += xv.y * kv7;
                acc[16] += xv.z * kv0;
                acc[17] += xv.z * kv1;
                acc[18] += xv.z * kv2;
                acc[19] += xv.z * kv3;
                acc[20] += xv.z * kv4;
                acc[21] += xv.z * kv5;
                acc[22] += xv.z * kv6;
                acc[23] += xv.z * kv7;
                acc[24] += xv.w * kv0;
                acc[25] += xv.w * kv1;
                acc[26] += xv.w * kv2;
                acc[27] += xv.w * kv3;
                acc[28] += xv.w * kv4;
                acc[29] += xv.w * kv5;
                acc[30] += xv.w * kv6;
                acc[31] += xv.w * kv7;
            }
        }
    }
    if (item >= p.items) { return; }
    store_v4(blk, 0u, ob + 0u, acc[0], acc[1], acc[2], acc[3]);
    store_v4(blk, 0u, ob + 4u, acc[4], acc[5], acc[6], acc[7]);
    store_v4(blk, 1u, ob + 0u, acc[8], acc[9], acc[10], acc[11]);
    store_v4(blk, 1u, ob + 4u, acc[12], acc[13], acc[14], acc[15]);
    store_v4(blk, 2u, ob + 0u, acc[16], acc[17], acc[18], acc[19]);
    store_v4(blk, 2u, ob + 4u, acc[20], acc[21], acc[22], acc[23]);
    store_v4(blk, 3u, ob + 0u, acc[24], acc[25], acc[26], acc[27]);
    store_v4(blk, 3u, ob + 4u, acc[28], acc[29], acc[30], acc[31]);
}

// ---------------------------------------------------------------------------------------------
// conv2d_smem_v4

var<workgroup> tile_x: array<vec4<f32>, 256>;
var<workgroup> tile_k: array<vec4<f32>, 256>;

// Element t of the implicit im2col row of output pixel (n, oi, oj): tap t / ci, channel t % ci;
// zero past the taps or in the padding.
fn patch_at(n: u32, oi: u32, oj: u32, t: u32) -> f32 {
    if (t >= p.kh * p.kw * p.ci) { return 0.0; }
    let c = t % p.ci;
    let tap = t / p.ci;
    // u32 arithmetic wraps, so positions above or left of the image fail the `< h` tests.
    var ii = oi * p.sh + (tap / p.kw) * p.dh - p.pt;
    var jj = oj * p.sw + (tap % p.kw) * p.dw - p.pl;
    if (p.uh != 1u || p.uw != 1u) {
        if (ii % p.uh != 0u || jj % p.uw != 0u) { return 0.0; }
        ii = ii / p.uh;
        jj = jj / p.uw;
    }
    if (ii >= p.h || jj >= p.w) { return 0.0; }
    return x[((n * p.h + ii) * p.w + jj) * p.ci + c];
}

@compute @workgroup_size(16, 16)
fn conv2d_smem_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let co4 = p.co / 4u;
    let m = p.n * p.oh * p.ow;
    let taps = p.kh * p.kw * p.ci;
    let cv = wg.x * 16u + lid.x;
    let row0 = wg.y * 64u;
    // What this invocation loads: pixel li / 4 of the tile, its 4 taps 4 * (li % 4) of the
    // step's 16; kernel row li / 16 of the step, vec4 column li % 16 of the tile.
    let pix = min(row0 + li / 4u, m - 1u);
    let pn = pix / (p.oh * p.ow);
    let oi = (pix / p.ow) % p.oh;
    let oj = pix % p.ow;
    let a_q = li % 4u;
    let b_r = li / 16u;
    let b_c = min(wg.x * 16u + li % 16u, co4 - 1u);
    var acc: array<vec4<f32>, 4>;
    for (var kk = 0u; kk < taps; kk += 16u) {
        let t0 = kk + 4u * a_q;
        tile_x[li] = vec4<f32>(
            patch_at(pn, oi, oj, t0),
            patch_at(pn, oi, oj, t0 + 1u),
            patch_at(pn, oi, oj, t0 + 2u),
            patch_at(pn, oi, oj, t0 + 3u),
        );
        let br = kk + b_r;
        var bv = vec4<f32>(0.0);
        if (br < taps) { bv = k4[br * co4 + b_c]; }
        tile_k[li] = bv;
        workgroupBarrier();
        for (var q = 0u; q < 4u; q++) {
            let b0 = tile_k[(4u * q) * 16u + lid.x];
            let b1 = tile_k[(4u * q + 1u) * 16u + lid.x];
            let b2 = tile_k[(4u * q + 2u) * 16u + lid.x];
            let b3 = tile_k[(4u * q + 3u) * 16u + lid.x];
            for (var i = 0u; i < 4u; i++) {
                let a = tile_x[(lid.y + 16u * i) * 4u + q];
                acc[i] += a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
            }
        }
        workgroupBarrier();
    }
    if (cv >= co4) { return; }
    var b = vec4<f32>(0.0);
    if (p.has_bias == 1u) { b = bias4[cv]; }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y + 16u * i;
        if (r < m) { y4[r * co4 + cv] = act4(acc[i] + b, p.act); }
    }
}

// ---------------------------------------------------------------------------------------------
// conv2d_flip: the backward-input kernel. kt[a, b, o, c] = k[kh-1-a, kw-1-b, c, o] for a forward
// kernel k [kh, kw, ci, co]; the input gradient is then the correlation of dz (upsampled by the
// strides) with kt.

@compute @workgroup_size(256)
fn conv2d_flip(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if (t >= p.items) { return; }
    let c = t % p.ci;
    let r = t / p.ci;
    let o = r % p.co;
    let tap = r / p.co;
    let a = tap / p.kw;
    let b = tap % p.kw;
    let src = (((p.kh - 1u - a) * p.kw + (p.kw - 1u - b)) * p.ci + c) * p.co + o;
    y[t] = k[src];
}

// ---------------------------------------------------------------------------------------------
// Backward kernel: partial sums over chunks of output pixels.

// The 4 flattened taps r0..r0+3 (clamped to the last): their x offsets relative to an output
// pixel's window corner (i·sh, j·sw) (wrapping u32, in scalars) and their (a·dh - pt,
// b·dw - pl) shifts.
struct TapBlock {
    // ((a·dh - pt) * w + (b·dw - pl)) * ci + c, wrapping.
    off: vec4<u32>,
    // a·dh - pt and b·dw - pl, wrapping.
    da: vec4<u32>,
    db: vec4<u32>,
}

fn tap_block(r0: u32) -> TapBlock {
    let r = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.taps - 1u));
    let c = r % p.ci;
    let ab = r / p.ci;
    let a = ab / p.kw;
    let b = ab % p.kw;
    let da = a * p.dh - vec4<u32>(p.pt);
    let db = b * p.dw - vec4<u32>(p.pl);
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

// The window corner (i·sh, j·sw) of output pixel `s`, as an x offset in scalars.
fn corner(s: Walk) -> u32 {
    return ((s.n * p.h + s.i * p.sh) * p.w + s.j * p.sw) * p.ci;
}

fn x_taps(s: Walk, tb: TapBlock, live: bool) -> vec4<f32> {
    let ii = vec4<u32>(s.i * p.sh) + tb.da;
    let jj = vec4<u32>(s.j * p.sw) + tb.db;
    let valid = (ii < vec4<u32>(p.h)) & (jj < vec4<u32>(p.w)) & vec4<bool>(live);
    let at = min(vec4<u32>(corner(s)) + tb.off, vec4<u32>(arrayLength(&x) - 1u));
    let v = vec4<f32>(x[at.x], x[at.y], x[at.z], x[at.w]);
    return select(vec4<f32>(0.0), v, valid);
}

// A dk invocation: which unit (tap block × channel block) and which chunk of pixels.
struct DkItem {
    live: bool,
    unit: u32,
    chunk: u32,
}

fn dk_item(gid: vec3<u32>, nwg: vec3<u32>, units: u32) -> DkItem {
    let item = item_index(gid, nwg);
    let it = min(item, p.items - 1u);
    return DkItem(item < p.items, it % units, it / units);
}

@compute @workgroup_size(64)
fn conv2d_dk_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let obs = (p.co + 3u) / 4u;
    let units = ((p.taps + 3u) / 4u) * obs;
    let di = dk_item(gid, nwg, units);
    let r0 = (di.unit / obs) * 4u;
    let o0 = (di.unit % obs) * 4u;
    let o = min(vec4<u32>(o0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.co - 1u));
    let tb = tap_block(r0);
    let start = di.chunk * p.chunk;
    // acc[m]: tap r0 + m, channels o.
    var acc: array<vec4<f32>, 4>;
    var s = walk_start(start);
    // A uniform trip count; pixels past the end (last chunk) contribute zero.
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let xv = x_taps(s, tb, pix < p.pixels);
        let zb = min(pix, p.pixels - 1u) * p.co;
        let d = vec4<f32>(dz[zb + o.x], dz[zb + o.y], dz[zb + o.z], dz[zb + o.w]);
        acc[0] += xv.x * d;
        acc[1] += xv.y * d;
        acc[2] += xv.z * d;
        acc[3] += xv.w * d;
        s = walk_next(s);
    }
    if (!di.live) { return; }
    let row = di.chunk * p.taps * p.co;
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

// conv2d_dk_v4: 8 taps × 4 vec4 of output channels per unit: per pixel 8 loads of x and 4 vec4
// loads of dz feed 128 multiply-adds.
@compute @workgroup_size(64)
fn conv2d_dk_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let co4 = p.co / 4u;
    let obs = (co4 + 3u) / 4u;
    let units = ((p.taps + 7u) / 8u) * obs;
    let di = dk_item(gid, nwg, units);
    let r0 = (di.unit / obs) * 8u;
    let ob = (di.unit % obs) * 4u;
    let o = min(vec4<u32>(ob) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(co4 - 1u));
    let ta = tap_block(r0);
    let tb = tap_block(r0 + 4u);
    let start = di.chunk * p.chunk;
    // acc[m * 4 + q]: tap r0 + m, output vec4 ob + q.
    var acc: array<vec4<f32>, 32>;
    var s = walk_start(start);
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let live = pix < p.pixels;
        let xa = x_taps(s, ta, live);
        let xb = x_taps(s, tb, live);
        let zb = min(pix, p.pixels - 1u) * co4;
        let d0 = dz4[zb + o.x];
        let d1 = dz4[zb + o.y];
        let d2 = dz4[zb + o.z];
        let d3 = dz4[zb + o.w];
        acc[0] += xa.x * d0;
        acc[1] += xa.x * d1;
        acc[2] += xa.x * d2;
        acc[3] += xa.x * d3;
        acc[4] += xa.y * d0;
        acc[5] += xa.y * d1;
        acc[6] += xa.y * d2;
        acc[7] += xa.y * d3;
        acc[8] += xa.z * d0;
        acc[9] += xa.z * d1;
        acc[10] += xa.z * d2;
        acc[11] += xa.z * d3;
        acc[12] += xa.w * d0;
        acc[13] += xa.w * d1;
        acc[14] += xa.w * d2;
        acc[15] += xa.w * d3;
        acc[16] += xb.x * d0;
        acc[17] += xb.x * d1;
        acc[18] += xb.x * d2;
        acc[19] += xb.x * d3;
        acc[20] += xb.y * d0;
        acc[21] += xb.y * d1;
        acc[22] += xb.y * d2;
        acc[23] += xb.y * d3;
        acc[24] += xb.z * d0;
        acc[25] += xb.z * d1;
        acc[26] += xb.z * d2;
        acc[27] += xb.z * d3;
        acc[28] += xb.w * d0;
        acc[29] += xb.w * d1;
        acc[30] += xb.w * d2;
        acc[31] += xb.w * d3;
        s = walk_next(s);
    }
    if (!di.live) { return; }
    let row = di.chunk * p.taps * co4;
    store_dk4(row, r0 + 0u, ob, acc[0], acc[1], acc[2], acc[3]);
    store_dk4(row, r0 + 1u, ob, acc[4], acc[5], acc[6], acc[7]);
    store_dk4(row, r0 + 2u, ob, acc[8], acc[9], acc[10], acc[11]);
    store_dk4(row, r0 + 3u, ob, acc[12], acc[13], acc[14], acc[15]);
    store_dk4(row, r0 + 4u, ob, acc[16], acc[17], acc[18], acc[19]);
    store_dk4(row, r0 + 5u, ob, acc[20], acc[21], acc[22], acc[23]);
    store_dk4(row, r0 + 6u, ob, acc[24], acc[25], acc[26], acc[27]);
    store_dk4(row, r0 + 7u, ob, acc[28], acc[29], acc[30], acc[31]);
}

// The 9th tap of conv2d_dk9_v4 (x_taps for a single tap).
fn x_tap(s: Walk, tb: TapBlock, live: bool) -> f32 {
    let ii = s.i * p.sh + tb.da.x;
    let jj = s.j * p.sw + tb.db.x;
    let valid = ii < p.h && jj < p.w && live;
    let at = min(corner(s) + tb.off.x, arrayLength(&x) - 1u);
    return select(0.0, x[at], valid);
}

// conv2d_dk9_v4: conv2d_dk_v4 for exactly 9 taps (a 3×3 kernel on one input channel, a
// grayscale image's first layer): all 9 in one unit, so per pixel 9 loads of x and 4 vec4 loads
// of dz feed 144 multiply-adds (conv2d_dk_v4 takes two units of 8, the second loading 8 taps
// and 4 vec4 of dz for one tap's 16 products).
@compute @workgroup_size(64)
fn conv2d_dk9_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let co4 = p.co / 4u;
    let obs = (co4 + 3u) / 4u;
    let di = dk_item(gid, nwg, obs);
    let ob = di.unit * 4u;
    let o = min(vec4<u32>(ob) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(co4 - 1u));
    let ta = tap_block(0u);
    let tb = tap_block(4u);
    let tc = tap_block(8u);
    let start = di.chunk * p.chunk;
    // acc[m * 4 + q]: tap m, output vec4 ob + q.
    var acc: array<vec4<f32>, 36>;
    var s = walk_start(start);
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let live = pix < p.pixels;
        let xa = x_taps(s, ta, live);
        let xb = x_taps(s, tb, live);
        let xc = x_tap(s, tc, live);
        let zb = min(pix, p.pixels - 1u) * co4;
        let d0 = dz4[zb + o.x];
        let d1 = dz4[zb + o.y];
        let d2 = dz4[zb + o.z];
        let d3 = dz4[zb + o.w];
        acc[0] += xa.x * d0;
        acc[1] += xa.x * d1;
        acc[2] += xa.x * d2;
        acc[3] += xa.x * d3;
        acc[4] += xa.y * d0;
        acc[5] += xa.y * d1;
        acc[6] += xa.y * d2;
        acc[7] += xa.y * d3;
        acc[8] += xa.z * d0;
        acc[9] += xa.z * d1;
        acc[10] += xa.z * d2;
        acc[11] += xa.z * d3;
        acc[12] += xa.w * d0;
        acc[13] += xa.w * d1;
        acc[14] += xa.w * d2;
        acc[15] += xa.w * d3;
        acc[16] += xb.x * d0;
        acc[17] += xb.x * d1;
        acc[18] += xb.x * d2;
        acc[19] += xb.x * d3;
        acc[20] += xb.y * d0;
        acc[21] += xb.y * d1;
        acc[22] += xb.y * d2;
        acc[23] += xb.y * d3;
        acc[24] += xb.z * d0;
        acc[25] += xb.z * d1;
        acc[26] += xb.z * d2;
        acc[27] += xb.z * d3;
        acc[28] += xb.w * d0;
        acc[29] += xb.w * d1;
        acc[30] += xb.w * d2;
        acc[31] += xb.w * d3;
        acc[32] += xc * d0;
        acc[33] += xc * d1;
        acc[34] += xc * d2;
        acc[35] += xc * d3;
        s = walk_next(s);
    }
    if (!di.live) { return; }
    let row = di.chunk * p.taps * co4;
    store_dk4(row, 0u, ob, acc[0], acc[1], acc[2], acc[3]);
    store_dk4(row, 1u, ob, acc[4], acc[5], acc[6], acc[7]);
    store_dk4(row, 2u, ob, acc[8], acc[9], acc[10], acc[11]);
    store_dk4(row, 3u, ob, acc[12], acc[13], acc[14], acc[15]);
    store_dk4(row, 4u, ob, acc[16], acc[17], acc[18], acc[19]);
    store_dk4(row, 5u, ob, acc[20], acc[21], acc[22], acc[23]);
    store_dk4(row, 6u, ob, acc[24], acc[25], acc[26], acc[27]);
    store_dk4(row, 7u, ob, acc[28], acc[29], acc[30], acc[31]);
    store_dk4(row, 8u, ob, acc[32], acc[33], acc[34], acc[35]);
}

// conv2d_dk_1x1: acc[2 * m + q] is input channel c0 + m × output vec4 o4 + q.
@compute @workgroup_size(64)
fn conv2d_dk_1x1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let ci4 = p.ci / 4u;
    let co4 = p.co / 4u;
    let obs = co4 / 2u;
    let di = dk_item(gid, nwg, (ci4 / 4u) * obs);
    let c0 = (di.unit / obs) * 16u;
    let o4 = (di.unit % obs) * 2u;
    let start = di.chunk * p.chunk;
    var acc: array<vec4<f32>, 32>;
    // A uniform trip count; pixels past the end (last chunk) read the last pixel and add zero.
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let keep = select(0.0, 1.0, pix < p.pixels);
        let at = min(pix, p.pixels - 1u);
        let xb = at * ci4 + c0 / 4u;
        let x0 = x4[xb] * keep;
        let x1 = x4[xb + 1u] * keep;
        let x2 = x4[xb + 2u] * keep;
        let x3 = x4[xb + 3u] * keep;
        let zb = at * co4 + o4;
        let d0 = dz4[zb];
        let d1 = dz4[zb + 1u];
        acc[0] += x0.x * d0;
        acc[1] += x0.x * d1;
        acc[2] += x0.y * d0;
        acc[3] += x0.y * d1;
        acc[4] += x0.z * d0;
        acc[5] += x0.z * d1;
        acc[6] += x0.w * d0;
        acc[7] += x0.w * d1;
        acc[8] += x1.x * d0;
        acc[9] += x1.x * d1;
        acc[10] += x1.y * d0;
        acc[11] += x1.y * d1;
        acc[12] += x1.z * d0;
        acc[13] += x1.z * d1;
        acc[14] += x1.w * d0;
        acc[15] += x1.w * d1;
        acc[16] += x2.x * d0;
        acc[17] += x2.x * d1;
        acc[18] += x2.y * d0;
        acc[19] += x2.y * d1;
        acc[20] += x2.z * d0;
        acc[21] += x2.z * d1;
        acc[22] += x2.w * d0;
        acc[23] += x2.w * d1;
        acc[24] += x3.x * d0;
        acc[25] += x3.x * d1;
        acc[26] += x3.y * d0;
        acc[27] += x3.y * d1;
        acc[28] += x3.z * d0;
        acc[29] += x3.z * d1;
        acc[30] += x3.w * d0;
        acc[31] += x3.w * d1;
    }
    if (!di.live) { return; }
    let row = di.chunk * p.ci * co4;
    dk4[row + (c0 + 0u) * co4 + o4] = acc[0];
    dk4[row + (c0 + 0u) * co4 + o4 + 1u] = acc[1];
    dk4[row + (c0 + 1u) * co4 + o4] = acc[2];
    dk4[row + (c0 + 1u) * co4 + o4 + 1u] = acc[3];
    dk4[row + (c0 + 2u) * co4 + o4] = acc[4];
    dk4[row + (c0 + 2u) * co4 + o4 + 1u] = acc[5];
    dk4[row + (c0 + 3u) * co4 + o4] = acc[6];
    dk4[row + (c0 + 3u) * co4 + o4 + 1u] = acc[7];
    dk4[row + (c0 + 4u) * co4 + o4] = acc[8];
    dk4[row + (c0 + 4u) * co4 + o4 + 1u] = acc[9];
    dk4[row + (c0 + 5u) * co4 + o4] = acc[10];
    dk4[row + (c0 + 5u) * co4 + o4 + 1u] = acc[11];
    dk4[row + (c0 + 6u) * co4 + o4] = acc[12];
    dk4[row + (c0 + 6u) * co4 + o4 + 1u] = acc[13];
    dk4[row + (c0 + 7u) * co4 + o4] = acc[14];
    dk4[row + (c0 + 7u) * co4 + o4 + 1u] = acc[15];
    dk4[row + (c0 + 8u) * co4 + o4] = acc[16];
    dk4[row + (c0 + 8u) * co4 + o4 + 1u] = acc[17];
    dk4[row + (c0 + 9u) * co4 + o4] = acc[18];
    dk4[row + (c0 + 9u) * co4 + o4 + 1u] = acc[19];
    dk4[row + (c0 + 10u) * co4 + o4] = acc[20];
    dk4[row + (c0 + 10u) * co4 + o4 + 1u] = acc[21];
    dk4[row + (c0 + 11u) * co4 + o4] = acc[22];
    dk4[row + (c0 + 11u) * co4 + o4 + 1u] = acc[23];
    dk4[row + (c0 + 12u) * co4 + o4] = acc[24];
    dk4[row + (c0 + 12u) * co4 + o4 + 1u] = acc[25];
    dk4[row + (c0 + 13u) * co4 + o4] = acc[26];
    dk4[row + (c0 + 13u) * co4 + o4 + 1u] = acc[27];
    dk4[row + (c0 + 14u) * co4 + o4] = acc[28];
    dk4[row + (c0 + 14u) * co4 + o4 + 1u] = acc[29];
    dk4[row + (c0 + 15u) * co4 + o4] = acc[30];
    dk4[row + (c0 + 15u) * co4 + o4 + 1u] = acc[31];
}

@compute @workgroup_size(256)
fn conv2d_c1_pack(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.items) { return; }
    let c = i / 72u;
    let t = (i % 72u) / 8u;
    let q = i % 8u;
    y[c * 128u + t * 8u + q] = k[t * p.co + 8u * c + q];
}

// x at tap (a, b) of output pixel (n, i, j) of a one-channel input, zero in the padding. The
// address is clamped to a valid pixel, so every lane loads (no divergent branch).
fn c1_tap(n: u32, i: u32, j: u32, a: u32, b: u32) -> f32 {
    let ii = i + a;
    let jj = j + b;
    let inside = ii >= p.pt && ii < p.h + p.pt && jj >= p.pl && jj < p.w + p.pl;
    let r = min(max(ii, p.pt) - p.pt, p.h - 1u);
    let c = min(max(jj, p.pl) - p.pl, p.w - 1u);
    return select(0.0, x[(n * p.h + r) * p.w + c], inside);
}

@compute @workgroup_size(64)
fn conv2d_c1_ubo8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Items past the end compute the last one and store nothing (an early return would leave
    // the lanes divergent, and lavapipe then reads the window lane by lane).
    let flat = item_index(gid, nwg);
    let it = min(flat, p.items - 1u);
    let j0 = 2u * (it % p.wblocks);
    let t = it / p.wblocks;
    let i = t % p.oh;
    let n = t / p.oh;
    // Two neighbouring pixels share 6 of their 9 taps: 12 loads for both.
    var p00 = vec4<f32>(0.0);
    var p01 = vec4<f32>(0.0);
    var p10 = vec4<f32>(0.0);
    var p11 = vec4<f32>(0.0);
    // Written out, not looped: the window's offsets must be constants.
    let x00 = c1_tap(n, i, j0, 0u, 0u);
    let x01 = c1_tap(n, i, j0, 0u, 1u);
    let x02 = c1_tap(n, i, j0, 0u, 2u);
    let x03 = c1_tap(n, i, j0, 0u, 3u);
    let x10 = c1_tap(n, i, j0, 1u, 0u);
    let x11 = c1_tap(n, i, j0, 1u, 1u);
    let x12 = c1_tap(n, i, j0, 1u, 2u);
    let x13 = c1_tap(n, i, j0, 1u, 3u);
    let x20 = c1_tap(n, i, j0, 2u, 0u);
    let x21 = c1_tap(n, i, j0, 2u, 1u);
    let x22 = c1_tap(n, i, j0, 2u, 2u);
    let x23 = c1_tap(n, i, j0, 2u, 3u);
    p00 += x00 * kw8[0];
    p01 += x00 * kw8[1];
    p10 += x01 * kw8[0];
    p11 += x01 * kw8[1];
    p00 += x01 * kw8[2];
    p01 += x01 * kw8[3];
    p10 += x02 * kw8[2];
    p11 += x02 * kw8[3];
    p00 += x02 * kw8[4];
    p01 += x02 * kw8[5];
    p10 += x03 * kw8[4];
    p11 += x03 * kw8[5];
    p00 += x10 * kw8[6];
    p01 += x10 * kw8[7];
    p10 += x11 * kw8[6];
    p11 += x11 * kw8[7];
    p00 += x11 * kw8[8];
    p01 += x11 * kw8[9];
    p10 += x12 * kw8[8];
    p11 += x12 * kw8[9];
    p00 += x12 * kw8[10];
    p01 += x12 * kw8[11];
    p10 += x13 * kw8[10];
    p11 += x13 * kw8[11];
    p00 += x20 * kw8[12];
    p01 += x20 * kw8[13];
    p10 += x21 * kw8[12];
    p11 += x21 * kw8[13];
    p00 += x21 * kw8[14];
    p01 += x21 * kw8[15];
    p10 += x22 * kw8[14];
    p11 += x22 * kw8[15];
    p00 += x22 * kw8[16];
    p01 += x22 * kw8[17];
    p10 += x23 * kw8[16];
    p11 += x23 * kw8[17];
    if (p.has_bias != 0u) {
        let b0 = bias4[2u * p.block];
        let b1 = bias4[2u * p.block + 1u];
        p00 += b0;
        p01 += b1;
        p10 += b0;
        p11 += b1;
    }
    let o = ((n * p.oh + i) * p.ow + j0) * (p.co / 4u) + 2u * p.block;
    if (flat < p.items) {
        y4[o] = act4(p00, p.act);
        y4[o + 1u] = act4(p01, p.act);
        if (j0 + 1u < p.ow) {
            y4[o + p.co / 4u] = act4(p10, p.act);
            y4[o + p.co / 4u + 1u] = act4(p11, p.act);
        }
    }
}

// conv2d_dk_1x1_16: conv2d_dk_1x1 with 16 output channels per unit (4 vec4 of dz): per pixel
// 8 vec4 loads feed 256 multiply-adds; acc[4 * m + q] is input channel c0 + m × output vec4
// o4 + q.
@compute @workgroup_size(64)
fn conv2d_dk_1x1_16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let ci4 = p.ci / 4u;
    let co4 = p.co / 4u;
    let obs = co4 / 4u;
    let di = dk_item(gid, nwg, (ci4 / 4u) * obs);
    let c0 = (di.unit / obs) * 16u;
    let o4 = (di.unit % obs) * 4u;
    let start = di.chunk * p.chunk;
    var acc: array<vec4<f32>, 64>;
    // A uniform trip count; pixels past the end (last chunk) read the last pixel and add zero.
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let keep = select(0.0, 1.0, pix < p.pixels);
        let at = min(pix, p.pixels - 1u);
        let xb = at * ci4 + c0 / 4u;
        let x0 = x4[xb] * keep;
        let x1 = x4[xb + 1u] * keep;
        let x2 = x4[xb + 2u] * keep;
        let x3 = x4[xb + 3u] * keep;
        let zb = at * co4 + o4;
        let d0 = dz4[zb];
        let d1 = dz4[zb + 1u];
        let d2 = dz4[zb + 2u];
        let d3 = dz4[zb + 3u];
        acc[0] += x0.x * d0;
        acc[1] += x0.x * d1;
        acc[2] += x0.x * d2;
        acc[3] += x0.x * d3;
        acc[4] += x0.y * d0;
        acc[5] += x0.y * d1;
        acc[6] += x0.y * d2;
        acc[7] += x0.y * d3;
        acc[8] += x0.z * d0;
        acc[9] += x0.z * d1;
        acc[10] += x0.z * d2;
        acc[11] += x0.z * d3;
        acc[12] += x0.w * d0;
        acc[13] += x0.w * d1;
        acc[14] += x0.w * d2;
        acc[15] += x0.w * d3;
        acc[16] += x1.x * d0;
        acc[17] += x1.x * d1;
        acc[18] += x1.x * d2;
        acc[19] += x1.x * d3;
        acc[20] += x1.y * d0;
        acc[21] += x1.y * d1;
        acc[22] += x1.y * d2;
        acc[23] += x1.y * d3;
        acc[24] += x1.z * d0;
        acc[25] += x1.z * d1;
        acc[26] += x1.z * d2;
        acc[27] += x1.z * d3;
        acc[28] += x1.w * d0;
        acc[29] += x1.w * d1;
        acc[30] += x1.w * d2;
        acc[31] += x1.w * d3;
        acc[32] += x2.x * d0;
        acc[33] += x2.x * d1;
        acc[34] += x2.x * d2;
        acc[35] += x2.x * d3;
        acc[36] += x2.y * d0;
        acc[37] += x2.y * d1;
        acc[38] += x2.y * d2;
        acc[39] += x2.y * d3;
        acc[40] += x2.z * d0;
        acc[41] += x2.z * d1;
        acc[42] += x2.z * d2;
        acc[43] += x2.z * d3;
        acc[44] += x2.w * d0;
        acc[45] += x2.w * d1;
        acc[46] += x2.w * d2;
        acc[47] += x2.w * d3;
        acc[48] += x3.x * d0;
        acc[49] += x3.x * d1;
        acc[50] += x3.x * d2;
        acc[51] += x3.x * d3;
        acc[52] += x3.y * d0;
        acc[53] += x3.y * d1;
        acc[54] += x3.y * d2;
        acc[55] += x3.y * d3;
        acc[56] += x3.z * d0;
        acc[57] += x3.z * d1;
        acc[58] += x3.z * d2;
        acc[59] += x3.z * d3;
        acc[60] += x3.w * d0;
        acc[61] += x3.w * d1;
        acc[62] += x3.w * d2;
        acc[63] += x3.w * d3;
    }
    if (!di.live) { return; }
    let row = di.chunk * p.ci * co4;
    dk4[row + (c0 + 0u) * co4 + o4 + 0u] = acc[0];
    dk4[row + (c0 + 0u) * co4 + o4 + 1u] = acc[1];
    dk4[row + (c0 + 0u) * co4 + o4 + 2u] = acc[2];
    dk4[row + (c0 + 0u) * co4 + o4 + 3u] = acc[3];
    dk4[row + (c0 + 1u) * co4 + o4 + 0u] = acc[4];
    dk4[row + (c0 + 1u) * co4 + o4 + 1u] = acc[5];
    dk4[row + (c0 + 1u) * co4 + o4 + 2u] = acc[6];
    dk4[row + (c0 + 1u) * co4 + o4 + 3u] = acc[7];
    dk4[row + (c0 + 2u) * co4 + o4 + 0u] = acc[8];
    dk4[row + (c0 + 2u) * co4 + o4 + 1u] = acc[9];
    dk4[row + (c0 + 2u) * co4 + o4 + 2u] = acc[10];
    dk4[row + (c0 + 2u) * co4 + o4 + 3u] = acc[11];
    dk4[row + (c0 + 3u) * co4 + o4 + 0u] = acc[12];
    dk4[row + (c0 + 3u) * co4 + o4 + 1u] = acc[13];
    dk4[row + (c0 + 3u) * co4 + o4 + 2u] = acc[14];
    dk4[row + (c0 + 3u) * co4 + o4 + 3u] = acc[15];
    dk4[row + (c0 + 4u) * co4 + o4 + 0u] = acc[16];
    dk4[row + (c0 + 4u) * co4 + o4 + 1u] = acc[17];
    dk4[row + (c0 + 4u) * co4 + o4 + 2u] = acc[18];
    dk4[row + (c0 + 4u) * co4 + o4 + 3u] = acc[19];
    dk4[row + (c0 + 5u) * co4 + o4 + 0u] = acc[20];
    dk4[row + (c0 + 5u) * co4 + o4 + 1u] = acc[21];
    dk4[row + (c0 + 5u) * co4 + o4 + 2u] = acc[22];
    dk4[row + (c0 + 5u) * co4 + o4 + 3u] = acc[23];
    dk4[row + (c0 + 6u) * co4 + o4 + 0u] = acc[24];
    dk4[row + (c0 + 6u) * co4 + o4 + 1u] = acc[25];
    dk4[row + (c0 + 6u) * co4 + o4 + 2u] = acc[26];
    dk4[row + (c0 + 6u) * co4 + o4 + 3u] = acc[27];
    dk4[row + (c0 + 7u) * co4 + o4 + 0u] = acc[28];
    dk4[row + (c0 + 7u) * co4 + o4 + 1u] = acc[29];
    dk4[row + (c0 + 7u) * co4 + o4 + 2u] = acc[30];
    dk4[row + (c0 + 7u) * co4 + o4 + 3u] = acc[31];
    dk4[row + (c0 + 8u) * co4 + o4 + 0u] = acc[32];
    dk4[row + (c0 + 8u) * co4 + o4 + 1u] = acc[33];
    dk4[row + (c0 + 8u) * co4 + o4 + 2u] = acc[34];
    dk4[row + (c0 + 8u) * co4 + o4 + 3u] = acc[35];
    dk4[row + (c0 + 9u) * co4 + o4 + 0u] = acc[36];
    dk4[row + (c0 + 9u) * co4 + o4 + 1u] = acc[37];
    dk4[row + (c0 + 9u) * co4 + o4 + 2u] = acc[38];
    dk4[row + (c0 + 9u) * co4 + o4 + 3u] = acc[39];
    dk4[row + (c0 + 10u) * co4 + o4 + 0u] = acc[40];
    dk4[row + (c0 + 10u) * co4 + o4 + 1u] = acc[41];
    dk4[row + (c0 + 10u) * co4 + o4 + 2u] = acc[42];
    dk4[row + (c0 + 10u) * co4 + o4 + 3u] = acc[43];
    dk4[row + (c0 + 11u) * co4 + o4 + 0u] = acc[44];
    dk4[row + (c0 + 11u) * co4 + o4 + 1u] = acc[45];
    dk4[row + (c0 + 11u) * co4 + o4 + 2u] = acc[46];
    dk4[row + (c0 + 11u) * co4 + o4 + 3u] = acc[47];
    dk4[row + (c0 + 12u) * co4 + o4 + 0u] = acc[48];
    dk4[row + (c0 + 12u) * co4 + o4 + 1u] = acc[49];
    dk4[row + (c0 + 12u) * co4 + o4 + 2u] = acc[50];
    dk4[row + (c0 + 12u) * co4 + o4 + 3u] = acc[51];
    dk4[row + (c0 + 13u) * co4 + o4 + 0u] = acc[52];
    dk4[row + (c0 + 13u) * co4 + o4 + 1u] = acc[53];
    dk4[row + (c0 + 13u) * co4 + o4 + 2u] = acc[54];
    dk4[row + (c0 + 13u) * co4 + o4 + 3u] = acc[55];
    dk4[row + (c0 + 14u) * co4 + o4 + 0u] = acc[56];
    dk4[row + (c0 + 14u) * co4 + o4 + 1u] = acc[57];
    dk4[row + (c0 + 14u) * co4 + o4 + 2u] = acc[58];
    dk4[row + (c0 + 14u) * co4 + o4 + 3u] = acc[59];
    dk4[row + (c0 + 15u) * co4 + o4 + 0u] = acc[60];
    dk4[row + (c0 + 15u) * co4 + o4 + 1u] = acc[61];
    dk4[row + (c0 + 15u) * co4 + o4 + 2u] = acc[62];
    dk4[row + (c0 + 15u) * co4 + o4 + 3u] = acc[63];
}
