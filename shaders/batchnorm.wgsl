// Batch normalization (Keras' BatchNormalization, axis=-1) over x viewed as [rows, c]: rows is
// n for a [n, c] input and n*h*w for an NHWC one, so the statistics are per channel.
//
//   training   mean = Σ x / rows, var = Σ (x - mean)² / rows (biased, two passes, as
//              tf.nn.moments); inv = 1 / sqrt(var + epsilon);
//              moving_mean = moving_mean * momentum + mean * (1 - momentum), moving_var alike,
//              in place; y = x * a + b with a = gamma * inv, b = beta - mean * a
//              (tf.nn.batch_normalization's arithmetic).
//   inference  the same y from mean = moving_mean, var = moving_var.
//   backward   s1 = Σ dy, s2 = Σ dy (x - mean); dbeta = s1, dgamma = s2 * inv;
//              dx = k dy + c2 (x - mean) + c3 with k = gamma * inv,
//              c2 = -k inv² s2 / rows, c3 = -k s1 / rows (the fused batch-norm gradient).
//
// Sums are partial sums over chunks of p.chunk rows into a [chunks, width] float32 tensor,
// which the caller adds up with sum_rows (the reduction style of every column sum here). One
// invocation per (chunk, channel), channels fastest: a workgroup of 64 spans chunks when there
// are fewer channels, instead of leaving the rest of its lanes idle (half of them at 32).
// In the float16 twin x, y, dy, dx are float16; the statistics, partial sums, gamma, beta and
// the moving statistics stay float32 (Keras computes batch normalization in float32 for
// float16 inputs, and gamma/beta are not autocast).
//
// Entry points:
//   bn_sum_part    partials[k, ch] = Σ_{rows of chunk k} x[r, ch].
//                  dispatch grid_1d(chunks * c, 64). bindings x, partials.
//   bn_sqdev_part  partials[k, ch] = Σ (x[r, ch] - sums[ch] / rows)².
//                  dispatch grid_1d(chunks * c, 64). bindings x, partials, sums.
//   bn_stats       one invocation per channel: stats = [mean; inv] from sums (Σ x) and sq
//                  (Σ (x - mean)²), moving statistics updated in place.
//                  dispatch (ceil(c/64), 1, 1). bindings sums, sq, moving_mean, moving_var,
//                  stats.
//   bn_infer_stats stats = [moving_mean; 1 / sqrt(moving_var + epsilon)].
//                  dispatch (ceil(c/64), 1, 1). bindings moving_mean, moving_var, stats.
//   bn_apply       y = x * a + b per element. dispatch grid_1d(items, 64) (flat item =
//                  gid.x + gid.y * num_workgroups.x * 64). bindings x, y, gamma, beta, stats.
//   bn_grad_part   partials[k, ch] = Σ dy, partials[k, c + ch] = Σ dy (x - mean).
//                  dispatch grid_1d(chunks * c, 64). bindings x, dy, partials, stats.
//   bn_grad_coef   per channel: dgamma, dbeta and coef = [k; c2; c3] from sums = [s1; s2].
//                  dispatch (ceil(c/64), 1, 1). bindings sums, gamma, stats, dgamma, dbeta,
//                  coef.
//   bn_dx          dx = k dy + c2 (x - mean) + c3. dispatch grid_1d(items, 64).
//                  bindings x, dy, dx, stats, coef.
// With a ReLU after the normalization (TensorFlow's _FusedBatchNormEx), ReLU's gradient
// applied to dy first, its mask recomputed from x (an affine's a and b may round otherwise
// than bn_apply_relu's own, where a backend contracts a product and a sum: the masks may then
// differ for values within an ulp of zero):
//   bn_affine      per channel: affine = [a; b], a = gamma * inv, b = beta - mean * a.
//                  dispatch (ceil(c/64), 1, 1). bindings gamma, beta, stats, affine.
//   bn_apply_relu  y = max(x * a + b, 0), a and b as bn_apply computes them.
//                  dispatch grid_1d(items, 64). bindings x, y, gamma, beta, stats.
//   bn_relu_grad_part, bn_relu_dx  bn_grad_part and bn_dx of g = x * a + b > 0 ? dy : 0.
//                  bindings x, dy, partials, stats, affine; x, dy, dx, stats, coef, affine.
// Bindings (group 0): 0 uniform Params; 1 x, 2 dy, 3 y, 4 dx (array<f32>, float16 in the
// twin); 5 partials, 6 sums, 7 sq, 8 gamma, 9 beta, 10 moving_mean, 11 moving_var, 12 stats,
// 13 coef, 14 dgamma, 15 dbeta, 16 affine (array<f32>, float32 in both). All storage read_write; tensors
// go to the used bindings in ascending order.
// Params: rows, c, chunk (rows per partial sum), items = rows * c (chunks * c for the partial
// sums), momentum, one_minus
// (1 - momentum, rounded once on the host), epsilon.
// Limits: at most six storage buffers per entry point, no workgroup memory (GL-compatible).

struct Params {
    rows: u32,
    c: u32,
    chunk: u32,
    items: u32,
    momentum: f32,
    one_minus: f32,
    epsilon: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;
@group(0) @binding(5) var<storage, read_write> partials: array<f32>;
@group(0) @binding(6) var<storage, read_write> sums: array<f32>;
@group(0) @binding(7) var<storage, read_write> sq: array<f32>;
@group(0) @binding(8) var<storage, read_write> gamma: array<f32>;
@group(0) @binding(9) var<storage, read_write> beta: array<f32>;
@group(0) @binding(10) var<storage, read_write> moving_mean: array<f32>;
@group(0) @binding(11) var<storage, read_write> moving_var: array<f32>;
@group(0) @binding(12) var<storage, read_write> stats: array<f32>;
@group(0) @binding(13) var<storage, read_write> coef: array<f32>;
@group(0) @binding(14) var<storage, read_write> dgamma: array<f32>;
@group(0) @binding(15) var<storage, read_write> dbeta: array<f32>;
@group(0) @binding(16) var<storage, read_write> affine: array<f32>;

fn item_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

@compute @workgroup_size(64)
fn bn_sum_part(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let k = i / p.c;
    let first = k * p.chunk;
    let last = min(first + p.chunk, p.rows);
    var s = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        s = s + x[r * p.c + ch];
    }
    partials[i] = s;
}

@compute @workgroup_size(64)
fn bn_sqdev_part(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let k = i / p.c;
    let mean = sums[ch] / f32(p.rows);
    let first = k * p.chunk;
    let last = min(first + p.chunk, p.rows);
    var s = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let d = x[r * p.c + ch] - mean;
        s = s + d * d;
    }
    partials[i] = s;
}

@compute @workgroup_size(64)
fn bn_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= p.c) { return; }
    let mean = sums[ch] / f32(p.rows);
    let variance = sq[ch] / f32(p.rows);
    stats[ch] = mean;
    stats[p.c + ch] = 1.0 / sqrt(variance + p.epsilon);
    moving_mean[ch] = moving_mean[ch] * p.momentum + mean * p.one_minus;
    moving_var[ch] = moving_var[ch] * p.momentum + variance * p.one_minus;
}

@compute @workgroup_size(64)
fn bn_infer_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= p.c) { return; }
    stats[ch] = moving_mean[ch];
    stats[p.c + ch] = 1.0 / sqrt(moving_var[ch] + p.epsilon);
}

@compute @workgroup_size(64)
fn bn_apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let a = gamma[ch] * stats[p.c + ch];
    let b = beta[ch] - stats[ch] * a;
    y[i] = x[i] * a + b;
}

@compute @workgroup_size(64)
fn bn_grad_part(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let k = i / p.c;
    let mean = stats[ch];
    let first = k * p.chunk;
    let last = min(first + p.chunk, p.rows);
    var s1 = 0.0;
    var s2 = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let g = dy[r * p.c + ch];
        s1 = s1 + g;
        s2 = s2 + g * (x[r * p.c + ch] - mean);
    }
    partials[k * 2u * p.c + ch] = s1;
    partials[k * 2u * p.c + p.c + ch] = s2;
}

@compute @workgroup_size(64)
fn bn_grad_coef(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= p.c) { return; }
    let s1 = sums[ch];
    let s2 = sums[p.c + ch];
    let inv = stats[p.c + ch];
    let k = gamma[ch] * inv;
    let rows = f32(p.rows);
    dbeta[ch] = s1;
    dgamma[ch] = s2 * inv;
    coef[ch] = k;
    coef[p.c + ch] = -k * inv * inv * s2 / rows;
    coef[2u * p.c + ch] = -k * s1 / rows;
}

@compute @workgroup_size(64)
fn bn_dx(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    dx[i] = coef[ch] * dy[i] + coef[p.c + ch] * (x[i] - stats[ch]) + coef[2u * p.c + ch];
}

@compute @workgroup_size(64)
fn bn_affine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= p.c) { return; }
    let a = gamma[ch] * stats[p.c + ch];
    affine[ch] = a;
    affine[p.c + ch] = beta[ch] - stats[ch] * a;
}

@compute @workgroup_size(64)
fn bn_apply_relu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let a = gamma[ch] * stats[p.c + ch];
    let b = beta[ch] - stats[ch] * a;
    y[i] = max(x[i] * a + b, 0.0);
}

@compute @workgroup_size(64)
fn bn_relu_grad_part(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let k = i / p.c;
    let mean = stats[ch];
    let a = affine[ch];
    let b = affine[p.c + ch];
    let first = k * p.chunk;
    let last = min(first + p.chunk, p.rows);
    var s1 = 0.0;
    var s2 = 0.0;
    for (var r = first; r < last; r = r + 1u) {
        let v = x[r * p.c + ch];
        let g = select(0.0, dy[r * p.c + ch], v * a + b > 0.0);
        s1 = s1 + g;
        s2 = s2 + g * (v - mean);
    }
    partials[k * 2u * p.c + ch] = s1;
    partials[k * 2u * p.c + p.c + ch] = s2;
}

@compute @workgroup_size(64)
fn bn_relu_dx(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = item_index(gid, nwg);
    if (i >= p.items) { return; }
    let ch = i % p.c;
    let v = x[i];
    let g = select(0.0, dy[i], v * affine[ch] + affine[p.c + ch] > 0.0);
    dx[i] = coef[ch] * g + coef[p.c + ch] * (v - stats[ch]) + coef[2u * p.c + ch];
}
