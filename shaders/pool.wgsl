// 2×2, stride-2, 'valid' max pooling (Keras' MaxPool2D() defaults), NHWC, and its gradient.
//
//   forward   y[n, i, j, c] = max of x over the window (2i..2i+1, 2j..2j+1); a later element
//             must be strictly larger to win, so ties keep the first in window order
//             (0,0), (0,1), (1,0), (1,1).
//   backward  dx: each window's dy goes to its FIRST maximum (recomputed from x), the other
//             three elements get 0; a dropped last row / column (odd h or w) gets 0. Windows do
//             not overlap, so one invocation writes all of its window and nothing is
//             accumulated; invocations cover ceil(h/2) × ceil(w/2) windows, the partial ones
//             (odd sizes) only writing zeros.
//
// Entry points (all @workgroup_size(64), items folded as grid_1d(items, 64): flat item =
// gid.x + gid.y * num_workgroups.x * 64; channels vary fastest):
//   maxpool_s      any c:      items = n*oh*ow*c.           bindings x, y.
//   maxpool_v4     c % 4 == 0: items = n*oh*ow*c/4.         bindings x4, y4.
//   maxpool_bwd_s  any c:      items = n*hb*wb*c.           bindings x, dy, dx.
//   maxpool_bwd_v4 c % 4 == 0: items = n*hb*wb*c/4.         bindings x4, dy4, dx4.
//   maxpool_act_grad_sum_v4  c % 4 == 0: maxpool_bwd_v4 with the gradient of the activation
//                  that produced x applied on the way (dz = routed dy · act'(x), x being the
//                  activation's output) and the bias gradient's first pass: items =
//                  lanes*c/4, channels fastest; item (lane, vec4 of channels) walks windows
//                  lane * lane_stride + k * step, k < steps, of the n*hb*wb (p.windows) and
//                  writes its column sums to row `lane` of sums4. Interleaved on GPUs
//                  (lane_stride 1, step = lanes: neighbouring lanes take neighbouring windows,
//                  so a subgroup's loads are contiguous however few channels there are), in
//                  runs on software adapters (lane_stride = steps, step 1: one invocation's
//                  windows stay together in the cache of the core that runs it). One pass
//                  reads x and dy once and writes dz (maxpool_bwd_v4 then the activation's
//                  gradient read x twice and wrote and read dx).
//                  bindings x4, dy4, dx4 (dz), sums4.
// (hb = ceil(h/2), wb = ceil(w/2).) When dy is empty (h or w < 2) the caller binds dx in its
// place; it is never read then.
// Bindings (group 0): 0 uniform Params; 1 x, 2 y, 3 dy, 4 dx: array<f32>; 5 x4, 6 y4, 7 dy4,
// 8 dx4: array<vec4<f32>> views. All storage read_write. Tensors go to the used bindings in
// ascending order.
// Params: n, h, w, c (in vec4s for the _v4 entry points), oh = h/2, ow = w/2, hb, wb, items;
// act (0 linear, 1 relu, 2 selu), windows, lane_stride, step, steps (maxpool_act_grad_sum_v4).
// Limits: four storage buffers (maxpool_act_grad_sum_v4; three for the others), no workgroup
// memory (GL-compatible).

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    hb: u32,
    wb: u32,
    items: u32,
    act: u32,
    windows: u32,
    lane_stride: u32,
    step: u32,
    steps: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;
@group(0) @binding(5) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dy4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> dx4: array<vec4<f32>>;
// maxpool_act_grad_sum_v4's partial column sums [lanes, c].
@group(0) @binding(9) var<storage, read_write> sums4: array<vec4<f32>>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

fn item_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Offset of window element (0, 0) of output (n, i, j), channel slot ch.
fn window_base(item: u32, rows: u32, cols: u32) -> vec4<u32> {
    let ch = item % p.c;
    let t = item / p.c;
    let j = t % cols;
    let t2 = t / cols;
    let i = t2 % rows;
    let n = t2 / rows;
    return vec4<u32>(((n * p.h + 2u * i) * p.w + 2u * j) * p.c + ch, n, i, j);
}

@compute @workgroup_size(64)
fn maxpool_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let b = window_base(item, p.oh, p.ow).x;
    let row = p.w * p.c;
    var m = x[b];
    let v01 = x[b + p.c];
    let v10 = x[b + row];
    let v11 = x[b + row + p.c];
    m = select(m, v01, v01 > m);
    m = select(m, v10, v10 > m);
    m = select(m, v11, v11 > m);
    y[item] = m;
}

@compute @workgroup_size(64)
fn maxpool_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let b = window_base(item, p.oh, p.ow).x;
    let row = p.w * p.c;
    var m = x4[b];
    let v01 = x4[b + p.c];
    let v10 = x4[b + row];
    let v11 = x4[b + row + p.c];
    m = select(m, v01, v01 > m);
    m = select(m, v10, v10 > m);
    m = select(m, v11, v11 > m);
    y4[item] = m;
}

@compute @workgroup_size(64)
fn maxpool_bwd_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let wb = window_base(item, p.hb, p.wb);
    let b = wb.x;
    let n = wb.y;
    let i = wb.z;
    let j = wb.w;
    let row = p.w * p.c;
    let has_right = 2u * j + 1u < p.w;
    let has_below = 2u * i + 1u < p.h;
    if (i < p.oh && j < p.ow) {
        let v00 = x[b];
        let v01 = x[b + p.c];
        let v10 = x[b + row];
        let v11 = x[b + row + p.c];
        let g = dy[((n * p.oh + i) * p.ow + j) * p.c + item % p.c];
        var m = v00;
        let t01 = v01 > m;
        m = select(m, v01, t01);
        let t10 = v10 > m;
        m = select(m, v10, t10);
        let t11 = v11 > m;
        // The winner: the last strict improvement.
        let w11 = t11;
        let w10 = t10 && !t11;
        let w01 = t01 && !t10 && !t11;
        let w00 = !t01 && !t10 && !t11;
        dx[b] = select(0.0, g, w00);
        dx[b + p.c] = select(0.0, g, w01);
        dx[b + row] = select(0.0, g, w10);
        dx[b + row + p.c] = select(0.0, g, w11);
    } else {
        // A partial window of an odd-sized input: dropped, no gradient.
        dx[b] = 0.0;
        if (has_right) { dx[b + p.c] = 0.0; }
        if (has_below) { dx[b + row] = 0.0; }
        if (has_right && has_below) { dx[b + row + p.c] = 0.0; }
    }
}

@compute @workgroup_size(64)
fn maxpool_bwd_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let wb = window_base(item, p.hb, p.wb);
    let b = wb.x;
    let n = wb.y;
    let i = wb.z;
    let j = wb.w;
    let row = p.w * p.c;
    let has_right = 2u * j + 1u < p.w;
    let has_below = 2u * i + 1u < p.h;
    let z = vec4<f32>(0.0);
    if (i < p.oh && j < p.ow) {
        let v00 = x4[b];
        let v01 = x4[b + p.c];
        let v10 = x4[b + row];
        let v11 = x4[b + row + p.c];
        let g = dy4[((n * p.oh + i) * p.ow + j) * p.c + item % p.c];
        var m = v00;
        let t01 = v01 > m;
        m = select(m, v01, t01);
        let t10 = v10 > m;
        m = select(m, v10, t10);
        let t11 = v11 > m;
        let w11 = t11;
        let w10 = t10 & !t11;
        let w01 = t01 & !t10 & !t11;
        let w00 = !t01 & !t10 & !t11;
        dx4[b] = select(z, g, w00);
        dx4[b + p.c] = select(z, g, w01);
        dx4[b + row] = select(z, g, w10);
        dx4[b + row + p.c] = select(z, g, w11);
    } else {
        dx4[b] = z;
        if (has_right) { dx4[b + p.c] = z; }
        if (has_below) { dx4[b + row] = z; }
        if (has_right && has_below) { dx4[b + row + p.c] = z; }
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
fn maxpool_act_grad_sum_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    if (item >= p.items) { return; }
    let ch = item % p.c;
    let lane = item / p.c;
    let row = p.w * p.c;
    let z = vec4<f32>(0.0);
    var s = z;
    for (var k = 0u; k < p.steps; k++) {
        let t = lane * p.lane_stride + k * p.step;
        if (t >= p.windows) { break; }
        let j = t % p.wb;
        let t2 = t / p.wb;
        let i = t2 % p.hb;
        let n = t2 / p.hb;
        let b = ((n * p.h + 2u * i) * p.w + 2u * j) * p.c + ch;
        if (i < p.oh && j < p.ow) {
            let v00 = x4[b];
            let v01 = x4[b + p.c];
            let v10 = x4[b + row];
            let v11 = x4[b + row + p.c];
            let g = dy4[((n * p.oh + i) * p.ow + j) * p.c + ch];
            // The first maximum in window order takes the gradient (as maxpool_bwd_v4).
            var m = v00;
            let t01 = v01 > m;
            m = select(m, v01, t01);
            let t10 = v10 > m;
            m = select(m, v10, t10);
            let t11 = v11 > m;
            let d00 = act_grad4(select(z, g, !t01 & !t10 & !t11), v00, p.act);
            let d01 = act_grad4(select(z, g, t01 & !t10 & !t11), v01, p.act);
            let d10 = act_grad4(select(z, g, t10 & !t11), v10, p.act);
            let d11 = act_grad4(select(z, g, t11), v11, p.act);
            dx4[b] = d00;
            dx4[b + p.c] = d01;
            dx4[b + row] = d10;
            dx4[b + row + p.c] = d11;
            s += d00 + d01 + d10 + d11;
        } else {
            // The dropped last row or column (odd h or w): no gradient.
            let has_right = 2u * j + 1u < p.w;
            let has_below = 2u * i + 1u < p.h;
            dx4[b] = z;
            if (has_right) { dx4[b + p.c] = z; }
            if (has_below) { dx4[b + row] = z; }
            if (has_right && has_below) { dx4[b + row + p.c] = z; }
        }
    }
    sums4[lane * p.c + ch] = s;
}
