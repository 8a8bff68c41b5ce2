// Optimizer steps with Keras 3 semantics, updating weights and slots in place.
//
// Entry points (all @workgroup_size(256), 1-D over n elements; dispatch grid_1d(n, 256):
// flat index i = gid.x + gid.y * num_workgroups.x * 256):
//   sgd           w -= lr * g.                                         bindings w, g
//   sgd_momentum  v = momentum * v - lr * g; w += v, or with nesterov
//                 w += momentum * v - lr * g (the new v).               bindings w, g, v
//   adam          m += (g - m) * one_minus_b1; v += (g² - v) * one_minus_b2;
//                 w -= alpha * m / (sqrt(v) + eps), where the host computes
//                 alpha = lr * sqrt(1 - b2^t) / (1 - b1^t) in f64.        bindings w, g, m, v
// Bindings (group 0): 0 uniform Params; 1 w, 2 g, 3 m, 4 v: storage read_write array<f32>.
// Tensors go to the used bindings in ascending order.
// Params: n, lr, momentum, nesterov (0/1), alpha, one_minus_b1, one_minus_b2, eps.
// Limits: four storage buffers (GL-compatible).

struct Params {
    n: u32,
    lr: f32,
    momentum: f32,
    nesterov: u32,
    alpha: f32,
    one_minus_b1: f32,
    one_minus_b2: f32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    w[i] -= p.lr * g[i];
}

@compute @workgroup_size(256)
fn sgd_momentum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nv = p.momentum * v[i] - p.lr * gi;
    v[i] = nv;
    if (p.nesterov == 1u) {
        w[i] += p.momentum * nv - p.lr * gi;
    } else {
        w[i] += nv;
    }
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nm = m[i] + (gi - m[i]) * p.one_minus_b1;
    let nv = v[i] + (gi * gi - v[i]) * p.one_minus_b2;
    m[i] = nm;
    v[i] = nv;
    w[i] -= p.alpha * nm / (sqrt(nv) + p.eps);
}
