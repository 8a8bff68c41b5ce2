// Average and max pooling with any window, strides and padding (Keras' AveragePooling2D and
// MaxPooling2D), and the global poolings (GlobalAveragePooling2D, GlobalMaxPooling2D), NHWC,
// with their gradients. (The tutorial's 2×2 max-pool has its own tuned family, pool.wgsl.)
//
//   avgpool         y[n, i, j, c] = mean of x over the window's rows i*sh - pt .. + ph and
//                   columns j*sw - pl .. + pw that lie inside the image ('same' windows that
//                   overhang divide by the count of real elements, as TensorFlow does).
//                   items = n*oh*ow*c.               bindings x, y.
//   avgpool_bwd     dx[n, r, q, c] = Σ over the windows (i, j) that contain (r, q) of
//                   dy[n, i, j, c] / count(i, j): one invocation per input element gathers
//                   (no atomics).  items = n*h*w*c.  bindings dy, dx.
//   maxpool         y[n, i, j, c] = maximum of x over the same clipped window ('same' padding
//                   never wins).  items = n*oh*ow*c.  bindings x, y.
//   maxpool_bwd     dx[n, r, q, c] = Σ over the windows (i, j) whose first maximum in
//                   row-major order is (r, q) of dy[n, i, j, c] (TensorFlow's MaxPoolGrad);
//                   one invocation per input element recomputes those windows' maxima
//                   (no atomics).  items = n*h*w*c.  bindings x, dy, dx.
//   global_avg      y[n, c] = mean of x[n, :, :, c] (f32 sum in a register).
//                   items = n*c.                      bindings x, y.
//   global_avg_bwd  dx[n, r, q, c] = dy[n, c] / (h*w).  items = n*h*w*c.  bindings dy, dx.
//   global_max      y[n, c] = max of x[n, :, :, c].  items = n*c.  bindings x, y.
//   global_max_bwd  dx[n, r, q, c] = dy[n, c] / ties where x equals the maximum (ties share
//                   it equally, TensorFlow's reduce_max gradient), else 0; one invocation per
//                   (n, c) finds the maximum and its ties, then writes the h*w pixels.
//                   items = n*c.                      bindings x, dy, dx.
//
// Entry points: all @workgroup_size(256), items folded as grid_1d(items, 256): flat item =
// gid.x + gid.y * num_workgroups.x * 256; channels vary fastest.
// Bindings (group 0): 0 uniform Params; 1 x, 2 y, 3 dy, 4 dx: storage read_write array<f32>,
// flat NHWC. Tensors go to the used bindings in ascending order.
// Params: n, h, w, c; oh, ow (output size); ph, pw (window); sh, sw (strides); pt, pl (padding
// above and to the left); items.
// Limits: three storage buffers, no workgroup memory (GL-compatible).

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    oh: u32,
    ow: u32,
    ph: u32,
    pw: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    items: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

// The window of output (i, j), clipped to the image: rows [r0, r1), columns [q0, q1).
fn window(i: u32, j: u32) -> vec4<u32> {
    let r = i32(i * p.sh) - i32(p.pt);
    let q = i32(j * p.sw) - i32(p.pl);
    let r0 = u32(max(r, 0));
    let q0 = u32(max(q, 0));
    let r1 = u32(clamp(r + i32(p.ph), 0, i32(p.h)));
    let q1 = u32(clamp(q + i32(p.pw), 0, i32(p.w)));
    return vec4<u32>(r0, r1, q0, q1);
}

// The outputs whose windows contain input (r, q): rows [i0, i1), columns [j0, j1). Window i
// covers rows i*sh - pt .. i*sh - pt + ph, so i runs over [ceil((r + pt + 1 - ph) / sh),
// (r + pt) / sh], clipped to the output.
fn windows_containing(r: u32, q: u32) -> vec4<u32> {
    let rp = i32(r + p.pt);
    let qp = i32(q + p.pl);
    let i0 = u32(max(rp - i32(p.ph) + i32(p.sh), 0)) / p.sh;
    let j0 = u32(max(qp - i32(p.pw) + i32(p.sw), 0)) / p.sw;
    let i1 = min(u32(rp) / p.sh + 1u, p.oh);
    let j1 = min(u32(qp) / p.sw + 1u, p.ow);
    return vec4<u32>(i0, i1, j0, j1);
}

@compute @workgroup_size(256)
fn avgpool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let j = (t / p.c) % p.ow;
    let i = (t / (p.c * p.ow)) % p.oh;
    let n = t / (p.c * p.ow * p.oh);
    let win = window(i, j);
    var sum = 0.0;
    for (var r = win.x; r < win.y; r++) {
        for (var q = win.z; q < win.w; q++) {
            sum += x[((n * p.h + r) * p.w + q) * p.c + c];
        }
    }
    let count = f32((win.y - win.x) * (win.w - win.z));
    y[t] = sum / count;
}

@compute @workgroup_size(256)
fn avgpool_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let q = (t / p.c) % p.w;
    let r = (t / (p.c * p.w)) % p.h;
    let n = t / (p.c * p.w * p.h);
    let wins = windows_containing(r, q);
    var sum = 0.0;
    for (var i = wins.x; i < wins.y; i++) {
        for (var j = wins.z; j < wins.w; j++) {
            let win = window(i, j);
            let count = f32((win.y - win.x) * (win.w - win.z));
            sum += dy[((n * p.oh + i) * p.ow + j) * p.c + c] / count;
        }
    }
    dx[t] = sum;
}

@compute @workgroup_size(256)
fn maxpool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let j = (t / p.c) % p.ow;
    let i = (t / (p.c * p.ow)) % p.oh;
    let n = t / (p.c * p.ow * p.oh);
    let win = window(i, j);
    var m = x[((n * p.h + win.x) * p.w + win.z) * p.c + c];
    for (var r = win.x; r < win.y; r++) {
        for (var q = win.z; q < win.w; q++) {
            m = max(m, x[((n * p.h + r) * p.w + q) * p.c + c]);
        }
    }
    y[t] = m;
}

@compute @workgroup_size(256)
fn maxpool_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let q = (t / p.c) % p.w;
    let r = (t / (p.c * p.w)) % p.h;
    let n = t / (p.c * p.w * p.h);
    let wins = windows_containing(r, q);
    var sum = 0.0;
    for (var i = wins.x; i < wins.y; i++) {
        for (var j = wins.z; j < wins.w; j++) {
            let win = window(i, j);
            // The window's first maximum: the first element, then only a strictly greater one.
            var best = x[((n * p.h + win.x) * p.w + win.z) * p.c + c];
            var at = vec2<u32>(win.x, win.z);
            for (var rr = win.x; rr < win.y; rr++) {
                for (var qq = win.z; qq < win.w; qq++) {
                    let v = x[((n * p.h + rr) * p.w + qq) * p.c + c];
                    if (v > best) {
                        best = v;
                        at = vec2<u32>(rr, qq);
                    }
                }
            }
            if (at.x == r && at.y == q) {
                sum += dy[((n * p.oh + i) * p.ow + j) * p.c + c];
            }
        }
    }
    dx[t] = sum;
}

@compute @workgroup_size(256)
fn global_avg(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let n = t / p.c;
    let hw = p.h * p.w;
    var sum = 0.0;
    for (var k = 0u; k < hw; k++) {
        sum += x[(n * hw + k) * p.c + c];
    }
    y[t] = sum / f32(hw);
}

@compute @workgroup_size(256)
fn global_avg_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let n = t / (p.c * p.h * p.w);
    dx[t] = dy[n * p.c + c] / f32(p.h * p.w);
}

@compute @workgroup_size(256)
fn global_max(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let n = t / p.c;
    let hw = p.h * p.w;
    var m = x[n * hw * p.c + c];
    for (var k = 1u; k < hw; k++) {
        m = max(m, x[(n * hw + k) * p.c + c]);
    }
    y[t] = m;
}

@compute @workgroup_size(256)
fn global_max_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = flat(gid, nwg);
    if (t >= p.items) { return; }
    let c = t % p.c;
    let n = t / p.c;
    let hw = p.h * p.w;
    var m = x[n * hw * p.c + c];
    for (var k = 1u; k < hw; k++) {
        m = max(m, x[(n * hw + k) * p.c + c]);
    }
    var ties = 0.0;
    for (var k = 0u; k < hw; k++) {
        ties += select(0.0, 1.0, x[(n * hw + k) * p.c + c] == m);
    }
    let g = dy[t] / ties;
    for (var k = 0u; k < hw; k++) {
        let at = (n * hw + k) * p.c + c;
        dx[at] = select(0.0, g, x[at] == m);
    }
}
