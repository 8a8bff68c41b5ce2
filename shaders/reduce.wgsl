// Reductions.
//
// Entry points:
//   sum_all     @workgroup_size(256), dispatch grid_1d(ceil(n / chunk) * 256, 256): workgroup
//               g = wg.x + wg.y * num_workgroups.x writes out[g] = alpha * Σ x[i] over i in
//               [g * chunk, (g + 1) * chunk) ∩ [0, n): each invocation sums a strided slice,
//               then a tree in workgroup memory. The caller runs passes until one chunk is
//               left; a chunk of 256 * 256 bounds the loop (Mesa's software adapters silently
//               cut a loop short after ~65,000 iterations) and spreads a long sum over the
//               device.
//   sum_rows    @workgroup_size(64), dispatch (ceil(cols / 64), ceil(rows / chunk), 1):
//               out[g * cols + c] = Σ_{r in chunk g} x[r * cols + c]  (column sums in chunks;
//               the caller applies it again to the [chunks, cols] partials until one row is left).
//   sum_rows_v4 the same for cols % 4 == 0, one vec4 of columns per invocation (a quarter of
//               the loads, which software adapters run one lane at a time); dispatch
//               (ceil(cols / 256), ceil(rows / chunk), 1).
//   sum_rows_wg the same sums (cols % 4 == 0) by a whole workgroup per block of columns: n (a
//               power of two, at most 64) lanes of vec4 columns × 256 / n lanes of rows; each
//               invocation sums every (256 / n)-th row of the chunk, then a tree in workgroup
//               memory adds the row lanes. For GPUs and narrow sums (bias gradients: 8 vec4
//               columns over 100k rows), where one invocation per column leaves the device
//               idle; dispatch (ceil(cols / 4 / n), ceil(rows / chunk), 1).
//   act_grad_sum_rows_v4  the activation's gradient and the first pass of its column sums in
//               one (cols % 4 == 0), @workgroup_size(64), dispatch grid_1d(lanes * cols / 4,
//               64): item (lane, vec4 column c), columns fastest, walks rows lane * n + k *
//               step, k < steps (lanes = chunk), writes dz4[i] = act'(dy4[i], x4[i] = y) and
//               out4[lane * cols4 + c] = Σ dz4[i], so the gradient is not read back for the bias
//               sum. Interleaved on GPUs (n = 1, step = lanes: neighbouring lanes take
//               neighbouring rows, so a subgroup's loads are contiguous however few columns
//               there are), in runs on software adapters (n = steps, step = 1).
//   argmax_rows @workgroup_size(64), dispatch grid_1d(rows, 64): idx[r] = first arg max of row r.
//   add_into    @workgroup_size(256), dispatch grid_1d(n, 256): out[i] += x[i] (AddN's steps).
//
// Bindings (group 0): 0 uniform Params; 1 x: array<f32>; 2 out: array<f32>; 3 idx: array<i32>;
// 4 x4, 5 out4: x and out as array<vec4<f32>>; 6 dy4, 7 dz4 (act_grad_sum_rows_v4).
// Params: n, rows, cols, chunk, alpha (n is sum_all's length and sum_rows_wg's column lanes);
// act, step, steps (act_grad_sum_rows_v4: act 1 relu, 2 selu, else linear; its lanes in chunk,
// the rows between lanes in n).
// Limits: 5 KiB of workgroup memory.

struct Params {
    n: u32,
    rows: u32,
    cols: u32,
    chunk: u32,
    alpha: f32,
    act: u32,
    step: u32,
    steps: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<i32>;
@group(0) @binding(4) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> dy4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dz4: array<vec4<f32>>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

var<workgroup> partial: array<f32, 256>;
var<workgroup> partial4: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn sum_all(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = wg.x + wg.y * nwg.x;
    // Whole workgroups past the last chunk (grid_1d rounds up) leave before any barrier.
    if (g * p.chunk >= p.n) { return; }
    let end = min(g * p.chunk + p.chunk, p.n);
    var s = 0.0;
    for (var i = g * p.chunk + li; i < end; i += 256u) {
        s += x[i];
    }
    partial[li] = s;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            partial[li] += partial[li + stride];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[g] = p.alpha * partial[0];
    }
}

@compute @workgroup_size(64)
fn sum_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.cols) { return; }
    let start = gid.y * p.chunk;
    let end = min(start + p.chunk, p.rows);
    var s = 0.0;
    for (var r = start; r < end; r++) {
        s += x[r * p.cols + c];
    }
    out[gid.y * p.cols + c] = s;
}

@compute @workgroup_size(64)
fn sum_rows_v4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let cols4 = p.cols / 4u;
    let c = gid.x;
    if (c >= cols4) { return; }
    let start = gid.y * p.chunk;
    let end = min(start + p.chunk, p.rows);
    var s = vec4<f32>(0.0);
    for (var r = start; r < end; r++) {
        s += x4[r * cols4 + c];
    }
    out4[gid.y * cols4 + c] = s;
}

@compute @workgroup_size(256)
fn sum_rows_wg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let cols4 = p.cols / 4u;
    let lanes_c = p.n;
    let lanes_r = 256u / lanes_c;
    let lc = li % lanes_c;
    let lr = li / lanes_c;
    let c = wg.x * lanes_c + lc;
    let start = wg.y * p.chunk;
    let end = min(start + p.chunk, p.rows);
    var s = vec4<f32>(0.0);
    if (c < cols4) {
        for (var r = start + lr; r < end; r += lanes_r) {
            s += x4[r * cols4 + c];
        }
    }
    partial4[li] = s;
    workgroupBarrier();
    for (var stride = lanes_r / 2u; stride > 0u; stride >>= 1u) {
        if (lr < stride) {
            partial4[li] += partial4[li + stride * lanes_c];
        }
        workgroupBarrier();
    }
    if (lr == 0u && c < cols4) {
        out4[wg.y * cols4 + c] = partial4[lc];
    }
}

// The derivative through the activation's output y, as elementwise.wgsl's act_grad4.
fn act_grad4(dy: vec4<f32>, y: vec4<f32>, kind: u32) -> vec4<f32> {
    switch kind {
        case 1u: { return select(vec4<f32>(0.0), dy, y > vec4<f32>(0.0)); }
        case 2u: {
            return select(dy * (y + SELU_SCALE * SELU_ALPHA), dy * SELU_SCALE, y > vec4<f32>(0.0));
        }
        default: { return dy; }
    }
}

@compute @workgroup_size(64)
fn act_grad_sum_rows_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let cols4 = p.cols / 4u;
    let item = gid.x + gid.y * nwg.x * 64u;
    let lanes = p.chunk;
    if (item >= lanes * cols4) { return; }
    let c = item % cols4;
    let lane = item / cols4;
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < p.steps; k++) {
        let r = lane * p.n + k * p.step;
        if (r >= p.rows) { break; }
        let i = r * cols4 + c;
        let d = act_grad4(dy4[i], x4[i], p.act);
        dz4[i] = d;
        s += d;
    }
    out4[lane * cols4 + c] = s;
}

@compute @workgroup_size(64)
fn argmax_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    var best = x[base];
    var at = 0u;
    for (var c = 1u; c < p.cols; c++) {
        let v = x[base + c];
        if (v > best) {
            best = v;
            at = c;
        }
    }
    idx[r] = i32(at);
}

@compute @workgroup_size(256)
fn add_into(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) { return; }
    out[i] += x[i];
}
