// Row-wise softmax, sparse softmax cross-entropy, and the accuracy count, over row-major
// [rows, cols] logits. Every row is shifted by its maximum before exponentiating, so logits of
// any magnitude (±1e4 and beyond) give finite probabilities, losses and gradients.
//
// Entry points:
//   softmax_rows @workgroup_size(64), dispatch grid_1d(rows, 64) (row = gid.x + gid.y *
//                num_workgroups.x * 64): probs[r, c] = exp(x[r, c] - max_r) / Σ_q exp(x[r, q] - max_r).
//                bindings logits, probs.
//   softmax_xent @workgroup_size(64), dispatch grid_1d(rows, 64): per row r with label l:
//                loss[r] = ln Σ_c exp(x[r, c] - max_r) + max_r - x[r, l];
//                dlogits[r, c] = (softmax(x)[r, c] - [c == l]) * inv_rows (the gradient of the
//                batch-mean loss). A label outside [0, cols) gives NaN for that row's loss and
//                gradient (TensorFlow's GPU behaviour; its CPU kernel raises an error instead).
//                bindings logits, labels, loss, dlogits.
//   accuracy     @workgroup_size(256), dispatch (1, 1, 1): out[0] = number of rows whose first
//                arg max equals the label, as f32 (each invocation counts a strided set of rows,
//                then a tree sum in workgroup memory). bindings logits, labels, out.
// Bindings (group 0): 0 uniform Params; 1 logits, 2 probs: array<f32>; 3 labels: array<i32>;
// 4 loss, 5 dlogits, 6 out: array<f32>. All storage read_write. Tensors go to the used
// bindings in ascending order.
// Params: rows, cols, nan_bits (0x7fc00000: NaN cannot be a WGSL constant), inv_rows = 1/rows.
// Limits: four storage buffers, 1 KiB of workgroup memory (GL-compatible). One invocation
// walks a whole row: meant for class counts (tens to thousands), not for huge rows.

struct Params {
    rows: u32,
    cols: u32,
    nan_bits: u32,
    inv_rows: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> probs: array<f32>;
@group(0) @binding(3) var<storage, read_write> labels: array<i32>;
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;
@group(0) @binding(5) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

var<workgroup> counts: array<u32, 256>;

fn row_max(base: u32) -> f32 {
    var m = logits[base];
    for (var c = 1u; c < p.cols; c++) {
        m = max(m, logits[base + c]);
    }
    return m;
}

@compute @workgroup_size(64)
fn softmax_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let m = row_max(base);
    var s = 0.0;
    for (var c = 0u; c < p.cols; c++) {
        let e = exp(logits[base + c] - m);
        probs[base + c] = e;
        s += e;
    }
    let inv = 1.0 / s;
    for (var c = 0u; c < p.cols; c++) {
        probs[base + c] *= inv;
    }
}

@compute @workgroup_size(64)
fn softmax_xent(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.x + gid.y * nwg.x * 64u;
    if (r >= p.rows) { return; }
    let base = r * p.cols;
    let label = labels[r];
    if (label < 0 || u32(label) >= p.cols) {
        let nan = bitcast<f32>(p.nan_bits);
        loss[r] = nan;
        for (var c = 0u; c < p.cols; c++) {
            dlogits[base + c] = nan;
        }
        return;
    }
    let l = u32(label);
    let m = row_max(base);
    var s = 0.0;
    for (var c = 0u; c < p.cols; c++) {
        s += exp(logits[base + c] - m);
    }
    loss[r] = log(s) + (m - logits[base + l]);
    let scale = p.inv_rows / s;
    for (var c = 0u; c < p.cols; c++) {
        let q = exp(logits[base + c] - m) * scale;
        dlogits[base + c] = select(q, q - p.inv_rows, c == l);
    }
}

@compute @workgroup_size(256)
fn accuracy(@builtin(local_invocation_index) li: u32) {
    var hits = 0u;
    if (p.cols > 0u) {
        for (var r = li; r < p.rows; r += 256u) {
            let base = r * p.cols;
            var best = logits[base];
            var at = 0u;
            for (var c = 1u; c < p.cols; c++) {
                let v = logits[base + c];
                if (v > best) {
                    best = v;
                    at = c;
                }
            }
            if (i32(at) == labels[r]) {
                hits += 1u;
            }
        }
    }
    counts[li] = hits;
    workgroupBarrier();
    for (var stride = 128u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            counts[li] += counts[li + stride];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[0] = f32(counts[0]);
    }
}
