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
//   rmsprop       v = rho * v + one_minus_rho * g²; w -= lr * g / sqrt(v + eps).   bindings w, g, v
//   rmsprop_momentum  as rmsprop, then s = momentum * s + lr * g / sqrt(v + eps);
//                 w -= s.                                               bindings w, g, v, s
//   rmsprop_centered  as rmsprop, with m = rho * m + one_minus_rho * g and the
//                 denominator sqrt(v - m² + eps).                       bindings w, g, m, v
//   rmsprop_centered_momentum  the centered step's slots and s (the momentum), w untouched:
//                 the first pass of a centered step with momentum.      bindings g, m, v, s
//   momentum_apply  w -= s: its second pass.                            bindings w, s
//   weight_decay  w -= w * wd * lr (Keras' decoupled decay, before an update).  binding w
//   clip_norm     w = g * clip / max(norm, clip), norm = sqrt(m[0]) (m[0] when m[0] <= 0):
//                 tf.clip_by_norm into a new tensor w; with mode 1, w = g * (clip *
//                 min(1 / norm, inverse_clip)), norm = sqrt(m[0]), NaN when m[0] is not
//                 finite: the global norm's scale.                      bindings w, g, m
//   clip_value    w = min(max(g, -clip), clip).                         bindings w, g
//   fused_update, fused_update_regions
//                 every variable of a step in one dispatch: one workgroup per chunk of at most
//                 1024 elements of one variable, four per invocation (vec4 views: allocations
//                 are 256-byte aligned and rounded), described by 8 words of `table` at entry
//                 base + chunk (chunk = wg.x + wg.y * num_workgroups.x; dispatch: n chunks,
//                 folded into y past 65,535): [len, w, g, a, b, c, regions, 0], len in
//                 elements, each offset in vec4s from the start of the region buffer it lies
//                 in, `regions` that buffer's binding (0 r0, 1 r1, 2 r2) in two bits per role
//                 (w bits 0-1, g 2-3, a 4-5, b 6-7, c 8-9). Lanes past len keep their values.
//                 With mode 1 the weight decay first (as weight_decay), then `kind`'s update
//                 with the same expressions as the entry points above, so the results are
//                 theirs bit for bit: 0 sgd; 1 sgd_momentum (a = v); 2 adam (a = m, b = v);
//                 3 rmsprop (a = velocity); 4 centered (b = average); 5 with momentum (c = s);
//                 6 centered with momentum. fused_update: every tensor in r0 (bindings table,
//                 r0); fused_update_regions: bindings table, r0, r1, r2.
// Bindings (group 0): 0 uniform Params; 1 w, 2 g, 3 m, 4 v, 5 s: storage read_write array<f32>;
// 6 table: array<u32>; 7 r0, 8 r1, 9 r2: whole arena regions, array<vec4<f32>>.
// Tensors go to the used bindings in ascending order.
// Params: n, lr, momentum, nesterov (0/1), alpha, one_minus_b1, one_minus_b2, eps, rho,
// one_minus_rho (1 - rho from Keras' f64), wd, clip, inverse_clip (1 / clip from f64), mode
// (clip_norm: 0 per tensor, 1 global; fused_update: 1 with weight decay), kind and base (the
// fused update's rule and first table entry).
// Limits: four storage buffers per entry point (GL-compatible): hence the two passes of a
// centered RMSprop step with momentum, which has five tensors, and the fused update's three
// regions (a step whose tensors span more regions takes a dispatch per group of three).

struct Params {
    n: u32,
    lr: f32,
    momentum: f32,
    nesterov: u32,
    alpha: f32,
    one_minus_b1: f32,
    one_minus_b2: f32,
    eps: f32,
    rho: f32,
    one_minus_rho: f32,
    wd: f32,
    clip: f32,
    inverse_clip: f32,
    mode: u32,
    kind: u32,
    base: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> s: array<f32>;

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

// ---- RMSprop, weight decay, gradient clipping ----

@compute @workgroup_size(256)
fn rmsprop(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nv = p.rho * v[i] + p.one_minus_rho * (gi * gi);
    v[i] = nv;
    w[i] -= p.lr * gi / sqrt(nv + p.eps);
}

@compute @workgroup_size(256)
fn rmsprop_momentum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nv = p.rho * v[i] + p.one_minus_rho * (gi * gi);
    v[i] = nv;
    let ns = p.momentum * s[i] + p.lr * gi / sqrt(nv + p.eps);
    s[i] = ns;
    w[i] -= ns;
}

@compute @workgroup_size(256)
fn rmsprop_centered(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nv = p.rho * v[i] + p.one_minus_rho * (gi * gi);
    v[i] = nv;
    let nm = p.rho * m[i] + p.one_minus_rho * gi;
    m[i] = nm;
    w[i] -= p.lr * gi / sqrt(nv - nm * nm + p.eps);
}

@compute @workgroup_size(256)
fn rmsprop_centered_momentum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gi = g[i];
    let nv = p.rho * v[i] + p.one_minus_rho * (gi * gi);
    v[i] = nv;
    let nm = p.rho * m[i] + p.one_minus_rho * gi;
    m[i] = nm;
    s[i] = p.momentum * s[i] + p.lr * gi / sqrt(nv - nm * nm + p.eps);
}

@compute @workgroup_size(256)
fn momentum_apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    w[i] -= s[i];
}

@compute @workgroup_size(256)
fn weight_decay(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let wi = w[i];
    w[i] = wi - wi * p.wd * p.lr;
}

@compute @workgroup_size(256)
fn clip_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let sum_squares = m[0];
    if (p.mode == 1u) {
        // Keras' `+ (norm - norm)` makes the scale NaN for a norm that is not finite; shader
        // compilers may fold that to 0, so the exponent bits decide.
        if ((bitcast<u32>(sum_squares) & 0x7f800000u) == 0x7f800000u) {
            w[i] = bitcast<f32>(0x7fc00000u);
            return;
        }
        let norm = sqrt(sum_squares);
        let scale = p.clip * min(1.0 / norm, p.inverse_clip);
        w[i] = g[i] * scale;
    } else {
        var norm = sum_squares;
        if (sum_squares > 0.0) {
            norm = sqrt(sum_squares);
        }
        w[i] = g[i] * p.clip / max(norm, p.clip);
    }
}

@compute @workgroup_size(256)
fn clip_value(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    w[i] = min(max(g[i], -p.clip), p.clip);
}

// ---- fused update: every variable of a step in one dispatch ----

@group(0) @binding(6) var<storage, read_write> table: array<u32>;
@group(0) @binding(7) var<storage, read_write> r0: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> r1: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> r2: array<vec4<f32>>;

// Four elements' variable and slots (a, b, c as the header names them).
struct Vals {
    w: vec4<f32>,
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
}

// Which slots `p.kind` reads and writes.
fn uses_a() -> bool { return p.kind != 0u; }
fn uses_b() -> bool { return p.kind == 2u || p.kind == 4u || p.kind == 6u; }
fn uses_c() -> bool { return p.kind >= 5u; }

// The update of four elements: the weight decay, then `p.kind`'s rule, with the expressions
// of the per-variable entry points above (vector operations round per component, as those do).
fn update(v0: Vals, gi: vec4<f32>) -> Vals {
    var v = v0;
    if (p.mode == 1u) {
        v.w = v.w - v.w * p.wd * p.lr;
    }
    switch p.kind {
        case 0u: {
            v.w -= p.lr * gi;
        }
        case 1u: {
            let nv = p.momentum * v.a - p.lr * gi;
            v.a = nv;
            if (p.nesterov == 1u) {
                v.w += p.momentum * nv - p.lr * gi;
            } else {
                v.w += nv;
            }
        }
        case 2u: {
            let nm = v.a + (gi - v.a) * p.one_minus_b1;
            let nv = v.b + (gi * gi - v.b) * p.one_minus_b2;
            v.a = nm;
            v.b = nv;
            v.w -= p.alpha * nm / (sqrt(nv) + p.eps);
        }
        default: {
            let nv = p.rho * v.a + p.one_minus_rho * (gi * gi);
            v.a = nv;
            var step: vec4<f32>;
            if (p.kind == 4u || p.kind == 6u) {
                let nm = p.rho * v.b + p.one_minus_rho * gi;
                v.b = nm;
                step = p.lr * gi / sqrt(nv - nm * nm + p.eps);
            } else {
                step = p.lr * gi / sqrt(nv + p.eps);
            }
            if (p.kind >= 5u) {
                let ns = p.momentum * v.c + step;
                v.c = ns;
                v.w -= ns;
            } else {
                v.w -= step;
            }
        }
    }
    return v;
}

// A table entry: [len, w, g, a, b, c, regions, 0].
struct Entry {
    len: u32,
    w: u32,
    g: u32,
    a: u32,
    b: u32,
    c: u32,
    regions: u32,
}

fn entry(wid: vec3<u32>, nwg: vec3<u32>) -> Entry {
    let e = (p.base + wid.x + wid.y * nwg.x) * 8u;
    return Entry(table[e], table[e + 1u], table[e + 2u], table[e + 3u], table[e + 4u],
        table[e + 5u], table[e + 6u]);
}

// The new values where lanes are the chunk's elements, the old ones past its end (the
// allocation's rounding, which the update leaves as it was).
fn keep_tail(old: Vals, fresh: Vals, first: u32, len: u32) -> Vals {
    let inside = vec4<u32>(first, first + 1u, first + 2u, first + 3u) < vec4<u32>(len);
    return Vals(select(old.w, fresh.w, inside), select(old.a, fresh.a, inside),
        select(old.b, fresh.b, inside), select(old.c, fresh.c, inside));
}

// Every tensor of the chunk in r0: no branch per load (the common case, and the cheap one on
// software adapters, which load lane by lane under any branch).
@compute @workgroup_size(256)
fn fused_update(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (wid.x + wid.y * nwg.x >= p.n) { return; }
    let t = entry(wid, nwg);
    let first = 4u * lid.x;
    if (first >= t.len) { return; }
    let k = lid.x;
    var v: Vals;
    v.w = r0[t.w + k];
    if (uses_a()) { v.a = r0[t.a + k]; }
    if (uses_b()) { v.b = r0[t.b + k]; }
    if (uses_c()) { v.c = r0[t.c + k]; }
    let o = keep_tail(v, update(v, r0[t.g + k]), first, t.len);
    r0[t.w + k] = o.w;
    if (uses_a()) { r0[t.a + k] = o.a; }
    if (uses_b()) { r0[t.b + k] = o.b; }
    if (uses_c()) { r0[t.c + k] = o.c; }
}

// The region binding `r` is uniform across a workgroup: these branches do not diverge.
fn ld(r: u32, i: u32) -> vec4<f32> {
    if (r == 0u) { return r0[i]; }
    if (r == 1u) { return r1[i]; }
    return r2[i];
}

fn st(r: u32, i: u32, x: vec4<f32>) {
    if (r == 0u) {
        r0[i] = x;
    } else if (r == 1u) {
        r1[i] = x;
    } else {
        r2[i] = x;
    }
}

// Tensors in up to three regions, each role's in the region its two bits of `regions` name.
@compute @workgroup_size(256)
fn fused_update_regions(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (wid.x + wid.y * nwg.x >= p.n) { return; }
    let t = entry(wid, nwg);
    let first = 4u * lid.x;
    if (first >= t.len) { return; }
    let k = lid.x;
    let rw = t.regions & 3u;
    let rg = (t.regions >> 2u) & 3u;
    let ra = (t.regions >> 4u) & 3u;
    let rb = (t.regions >> 6u) & 3u;
    let rc = (t.regions >> 8u) & 3u;
    var v: Vals;
    v.w = ld(rw, t.w + k);
    if (uses_a()) { v.a = ld(ra, t.a + k); }
    if (uses_b()) { v.b = ld(rb, t.b + k); }
    if (uses_c()) { v.c = ld(rc, t.c + k); }
    let o = keep_tail(v, update(v, ld(rg, t.g + k)), first, t.len);
    st(rw, t.w + k, o.w);
    if (uses_a()) { st(ra, t.a + k, o.a); }
    if (uses_b()) { st(rb, t.b + k, o.b); }
    if (uses_c()) { st(rc, t.c + k, o.c); }
}
