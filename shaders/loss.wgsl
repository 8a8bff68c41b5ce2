// Keras' losses on float targets and the metrics beyond sparse accuracy, over row-major
// [rows, cols] model outputs: one invocation walks one row. Kept float32 (no float16 twin):
// the loss is computed in float32 whatever the layers compute in, as Keras advises.
//
// Entry points (all @workgroup_size(64), dispatch grid_1d(rows, 64) — grid_1d(n, 64) for
// sigmoid_map — with row = gid.x + gid.y * num_workgroups.x * 64):
//   dense_loss   per row r, on z[r, :] against targets[r, :] (label smoothing ls applied to the
//                targets of the cross-entropies: y (1 - ls) + ls / cols, or + ls / 2 for the
//                binary one), by p.kind:
//                  0 categorical on logits: Σ_c y_c (lse(z) - z_c); dz = softmax(z) - y
//                  1 categorical on probabilities: q = z / Σ z clipped to [EPS, 1 - EPS],
//                    -Σ y log q; dz through the clip (0 outside) and the normalization
//                  2 binary on logits: mean_c max(z, 0) - z y + log1p(exp(-|z|));
//                    dz = (sigmoid(z) - y) / cols
//                  3 binary on probabilities: z clipped to [EPS, 1 - EPS],
//                    mean_c -(y log z + (1 - y) log(1 - z)); dz 0 outside the clip
//                  4 mean squared error, 5 mean absolute error of o = act(z) (act: 0 identity,
//                    1 softmax over the row, 2 sigmoid), mean over the row; dz through act
//                loss[r] = row loss * row_scale; dz[r, c] = d(row loss)/dz[r, c] * grad_scale.
//                bindings z, targets, loss, dz.
//   metric_rows  out[r] for o = act(z[r, :]) against targets[r, :], by p.kind: 1 first arg max
//                of o == first arg max of targets (1 or 0); 2 mean_c ([o_c > threshold] ==
//                y_c); 3 mean_c (o_c - y_c)^2. bindings z, targets, out.
//   top_k_rows   out[r] = 1 when labels[r] is among the k largest of o = act(z[r, :]) (ties at
//                the boundary count as in: fewer than k values strictly greater), 0 for a
//                label outside [0, cols) or a non-finite value in the row (TF's in_top_k).
//                bindings z, labels, out.
//   sigmoid_map  out[i] = sigmoid(z[i]) for i < n. bindings z, out.
// Bindings (group 0): 0 uniform Params; 1 z, 2 targets: array<f32>; 3 labels: array<i32>;
// 4 loss, 5 dz, 6 out: array<f32>. All storage read_write. Tensors go to the used bindings in
// ascending order.
// Params: rows, cols, kind, act, label_smoothing, row_scale, grad_scale, k, threshold, n.
// Limits: four storage buffers; one invocation per row: class counts (tens to thousands).

struct Params {
    rows: u32,
    cols: u32,
    kind: u32,
    act: u32,
    label_smoothing: f32,
    row_scale: f32,
    grad_scale: f32,
    k: u32,
    threshold: f32,
    n: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> z: array<f32>;
@group(0) @binding(2) var<storage, read_write> targets: array<f32>;
@group(0) @binding(3) var<storage, read_write> labels: array<i32>;
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;
@group(0) @binding(5) var<storage, read_write> dz: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// Keras' backend.epsilon().
const EPS: f32 = 1e-7;

// 1 / (1 + e^-v) without overflow on either side.
fn sigmoid(v: f32) -> f32 {
    if (v >= 0.0) {
        return 1.0 / (1.0 + exp(-v));
    }
    let e = exp(v);
    return e / (1.0 + e);
}

// log(1 + x) accurate for small x (WGSL has no log1p).
fn log1p(x: f32) -> f32 {
    let u = 1.0 + x;
    if (u == 1.0) {
        return x;
    }
    return log(u) * x / (u - 1.0);
}

fn row_max(base: u32) -> f32 {
    var m = z[base];
    for (var c = 1u; c < p.cols; c++) {
        m = max(m, z[base + c]);
    }
    return m;
}

// 1 / Σ_c exp(z - m): the softmax's normalizer (1 unless act is softmax).
fn inv_sum(base: u32, m: f32) -> f32 {
    if (p.act != 1u) {
        return 1.0;
    }
    var s = 0.0;
    for (var c = 0u; c < p.cols; c++) {
        s += exp(z[base + c] - m);
    }
    return 1.0 / s;
}

// o = act(z[base + c]).
fn act_at(base: u32, c: u32, m: f32, inv: f32) -> f32 {
    let v = z[base + c];
    if (p.act == 1u) {
        return exp(v - m) * inv;
    }
    if (p.act == 2u) {
        return sigmoid(v);
    }
    return v;
}

fn row_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

@compute @workgroup_size(64)
fn dense_loss(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let n = f32(p.cols);
    let ls = p.label_smoothing;
    let gs = p.grad_scale;
    var l = 0.0;
    if (p.kind == 0u) {
        let m = row_max(base);
        var s = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            s += exp(z[base + c] - m);
        }
        let lse = log(s) + m;
        for (var c = 0u; c < p.cols; c++) {
            let y = targets[base + c] * (1.0 - ls) + ls / n;
            let v = z[base + c];
            l += y * (lse - v);
            dz[base + c] = (exp(v - m) / s - y) * gs;
        }
    } else if (p.kind == 1u) {
        var total = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            total += z[base + c];
        }
        var gq = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            let y = targets[base + c] * (1.0 - ls) + ls / n;
            let q = z[base + c] / total;
            let qc = clamp(q, EPS, 1.0 - EPS);
            l -= y * log(qc);
            let g = select(0.0, -y / qc, q >= EPS && q <= 1.0 - EPS);
            gq += g * q;
            dz[base + c] = g;
        }
        for (var c = 0u; c < p.cols; c++) {
            dz[base + c] = (dz[base + c] - gq) / total * gs;
        }
    } else if (p.kind == 2u) {
        for (var c = 0u; c < p.cols; c++) {
            let y = targets[base + c] * (1.0 - ls) + 0.5 * ls;
            let v = z[base + c];
            l += max(v, 0.0) - v * y + log1p(exp(-abs(v)));
            dz[base + c] = (sigmoid(v) - y) / n * gs;
        }
        l /= n;
    } else if (p.kind == 3u) {
        for (var c = 0u; c < p.cols; c++) {
            let y = targets[base + c] * (1.0 - ls) + 0.5 * ls;
            let v = z[base + c];
            let q = clamp(v, EPS, 1.0 - EPS);
            l -= y * log(q) + (1.0 - y) * log(1.0 - q);
            let g = -(y / q - (1.0 - y) / (1.0 - q)) / n;
            dz[base + c] = select(0.0, g, v >= EPS && v <= 1.0 - EPS) * gs;
        }
        l /= n;
    } else {
        let m = row_max(base);
        let inv = inv_sum(base, m);
        // Pass 1: the loss, dL/do into dz, and Σ dL/do · o for the softmax's chain rule.
        var dot = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            let o = act_at(base, c, m, inv);
            let d = o - targets[base + c];
            var g = sign(d) / n;
            if (p.kind == 4u) {
                l += d * d;
                g = 2.0 * d / n;
            } else {
                l += abs(d);
            }
            dz[base + c] = g;
            dot += g * o;
        }
        l /= n;
        // Pass 2: through the activation.
        for (var c = 0u; c < p.cols; c++) {
            let o = act_at(base, c, m, inv);
            let g = dz[base + c];
            var d = g;
            if (p.act == 1u) {
                d = o * (g - dot);
            } else if (p.act == 2u) {
                d = g * o * (1.0 - o);
            }
            dz[base + c] = d * gs;
        }
    }
    loss[r] = l * p.row_scale;
}

@compute @workgroup_size(64)
fn metric_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let m = row_max(base);
    let inv = inv_sum(base, m);
    var v = 0.0;
    if (p.kind == 1u) {
        var best_o = act_at(base, 0u, m, inv);
        var at_o = 0u;
        var best_y = targets[base];
        var at_y = 0u;
        for (var c = 1u; c < p.cols; c++) {
            let o = act_at(base, c, m, inv);
            if (o > best_o) {
                best_o = o;
                at_o = c;
            }
            let y = targets[base + c];
            if (y > best_y) {
                best_y = y;
                at_y = c;
            }
        }
        v = select(0.0, 1.0, at_o == at_y);
    } else if (p.kind == 2u) {
        var hits = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            let o = select(0.0, 1.0, act_at(base, c, m, inv) > p.threshold);
            hits += select(0.0, 1.0, o == targets[base + c]);
        }
        v = hits / f32(p.cols);
    } else {
        var s = 0.0;
        for (var c = 0u; c < p.cols; c++) {
            let d = act_at(base, c, m, inv) - targets[base + c];
            s += d * d;
        }
        v = s / f32(p.cols);
    }
    out[r] = v;
}

// Whether v is infinite or NaN (WGSL has no isfinite; comparisons with NaN may be folded).
fn non_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}

@compute @workgroup_size(64)
fn top_k_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row_index(gid, nwg);
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let label = labels[r];
    if (label < 0 || u32(label) >= p.cols) {
        out[r] = 0.0;
        return;
    }
    let m = row_max(base);
    let inv = inv_sum(base, m);
    let t = act_at(base, u32(label), m, inv);
    var above = 0u;
    var bad = false;
    for (var c = 0u; c < p.cols; c++) {
        let o = act_at(base, c, m, inv);
        bad = bad || non_finite(o);
        above += select(0u, 1u, o > t);
    }
    out[r] = select(0.0, 1.0, !bad && above < p.k);
}

@compute @workgroup_size(64)
fn sigmoid_map(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = row_index(gid, nwg);
    if (i >= p.n) { return; }
    out[i] = sigmoid(z[i]);
}
