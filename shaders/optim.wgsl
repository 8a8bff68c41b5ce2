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
//                 The gradient clipped first with clip_value 1 (as clip_value: Keras' clipvalue).
//                 With mode 1 the weight decay first (as weight_decay), then `kind`'s update
//                 with the same expressions as the entry points above, so the results are
//                 theirs bit for bit: 0 sgd; 1 sgd_momentum (a = v); 2 adam (a = m, b = v);
//                 3 rmsprop (a = velocity); 4 centered (b = average); 5 with momentum (c = s);
//                 6 centered with momentum. fused_update: every tensor in r0 (bindings table,
//                 r0); fused_update_regions: bindings table, r0, r1, r2.
//   finite_check, fused_update_ls, fused_update_ls_regions, loss_scale_seed, loss_scale_advance
//                 dynamic loss scaling decided on the device, over the state `ls` (4 u32: flag,
//                 exponent e, counter, iterations; see its declaration): finite_check sets the
//                 flag when a gradient element of the table's chunks is not finite (bindings
//                 table, r0, r1, ls; the table's regions are at most two); fused_update_ls[_regions]
//                 are the fused update (bindings table, r0[, r1], ls) doing nothing while the
//                 flag is set, with the gradient times ldexp(inverse_base, -e) when `unscale` is
//                 1, and lr, alpha from `lrs`, `alphas` at entry ls[3] - t_base (at most
//                 `count`); loss_scale_seed: w = ldexp(w * factor, e) (bindings w, ls; grid over
//                 n); loss_scale_unscale: w = g * ldexp(inverse_base, -e), flagging a g that is
//                 not finite (bindings w, g, ls; grid over n); loss_scale_advance: Keras' rules
//                 with `growth` (binding ls; one invocation).
// Bindings (group 0): 0 uniform Params; 1 w, 2 g, 3 m, 4 v, 5 s: storage read_write array<f32>;
// 6 table: array<u32>; 7 r0, 8 r1, 9 r2: whole arena regions, array<vec4<f32>>; 10 ls:
// array<u32>.
// Tensors go to the used bindings in ascending order.
// Params: n, lr, momentum, nesterov (0/1), alpha, one_minus_b1, one_minus_b2, eps, rho,
// one_minus_rho (1 - rho from Keras' f64), wd, clip, inverse_clip (1 / clip from f64), mode
// (clip_norm: 0 per tensor, 1 global; fused_update: 1 with weight decay), kind and base (the
// fused update's rule and first table entry); the loss-scaled entries' unscale, t_base,
// count, inverse_base, factor, growth, the fused updates' clip_value (0/1, with clip), and 16
// learning rates and Adam step sizes (lrs, alphas).
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
    // Loss scaling on the device (the `_ls` entry points; zero elsewhere).
    unscale: u32,
    t_base: u32,
    count: u32,
    inverse_base: f32,
    factor: f32,
    growth: u32,
    clip_value: u32,
    e_min: i32,
    e_max: i32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
    lrs: array<vec4<f32>, 4>,
    alphas: array<vec4<f32>, 4>,
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
// The gradient as the fused update takes it: clipped to [-clip, clip] with `clip_value` (the
// clip_value entry point's expression), as it is otherwise.
fn clip_grad(g: vec4<f32>) -> vec4<f32> {
    if (p.clip_value == 0u) { return g; }
    return min(max(g, vec4<f32>(-p.clip)), vec4<f32>(p.clip));
}

fn update(v0: Vals, gi: vec4<f32>) -> Vals {
    return update_at(v0, gi, p.lr, p.alpha);
}

// `update` at the learning rate `lr` and Adam step size `alpha` (the step's, from `p` or from
// the loss-scaled update's table).
fn update_at(v0: Vals, gi: vec4<f32>, lr: f32, alpha: f32) -> Vals {
    var v = v0;
    if (p.mode == 1u) {
        v.w = v.w - v.w * p.wd * lr;
    }
    switch p.kind {
        case 0u: {
            v.w -= lr * gi;
        }
        case 1u: {
            let nv = p.momentum * v.a - lr * gi;
            v.a = nv;
            if (p.nesterov == 1u) {
                v.w += p.momentum * nv - lr * gi;
            } else {
                v.w += nv;
            }
        }
        case 2u: {
            let nm = v.a + (gi - v.a) * p.one_minus_b1;
            let nv = v.b + (gi * gi - v.b) * p.one_minus_b2;
            v.a = nm;
            v.b = nv;
            v.w -= alpha * nm / (sqrt(nv) + p.eps);
        }
        default: {
            let nv = p.rho * v.a + p.one_minus_rho * (gi * gi);
            v.a = nv;
            var step: vec4<f32>;
            if (p.kind == 4u || p.kind == 6u) {
                let nm = p.rho * v.b + p.one_minus_rho * gi;
                v.b = nm;
                step = lr * gi / sqrt(nv - nm * nm + p.eps);
            } else {
                step = lr * gi / sqrt(nv + p.eps);
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
    let o = keep_tail(v, update(v, clip_grad(r0[t.g + k])), first, t.len);
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
    let o = keep_tail(v, update(v, clip_grad(ld(rg, t.g + k))), first, t.len);
    st(rw, t.w + k, o.w);
    if (uses_a()) { st(ra, t.a + k, o.a); }
    if (uses_b()) { st(rb, t.b + k, o.b); }
    if (uses_c()) { st(rc, t.c + k, o.c); }
}

// ---- loss scaling on the device ----

// The loss-scale state (one per device group): [0] the step's flag (non-zero once some
// gradient element is not finite), [1] the scale's exponent e (i32 bits: the scale is
// ldexp(base, e), base the host's), [2] finite steps in a row, [3] applied steps
// (optimizer.iterations, low 32 bits). Integers only: every backend keeps their bits.
@group(0) @binding(10) var<storage, read_write> ls: array<u32>;

// Whether lane k of the chunk at vec4 offset `at` in region `r` (r0 or r1) holds an element
// that is not finite. The exponent bits rather than x != x: WGSL lets a compiler assume floats
// are finite.
fn not_finite(x: vec4<f32>) -> bool {
    return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}

fn ld2(r: u32, i: u32) -> vec4<f32> {
    if (r == 0u) { return r0[i]; }
    return r1[i];
}

fn st2(r: u32, i: u32, x: vec4<f32>) {
    if (r == 0u) {
        r0[i] = x;
    } else {
        r1[i] = x;
    }
}

@compute @workgroup_size(256)
fn finite_check(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (wid.x + wid.y * nwg.x >= p.n) { return; }
    let t = entry(wid, nwg);
    let first = 4u * lid.x;
    if (first >= t.len) { return; }
    let g = ld2((t.regions >> 2u) & 3u, t.g + lid.x);
    // Lanes past the chunk's end hold the allocation's rounding (NaN under the trap).
    let inside = vec4<u32>(first, first + 1u, first + 2u, first + 3u) < vec4<u32>(t.len);
    if (not_finite(select(vec4<f32>(0.0), g, inside))) {
        // Every writer writes 1: the races agree.
        ls[0] = 1u;
    }
}

// The step's learning rate and Adam step size: entry ls[3] - t_base of the table (the host
// fills one per iteration count the device may be at, counting every step it recorded since
// the count it read, so the entry is always there; the min only keeps the index in bounds).
fn lr_alpha() -> vec2<f32> {
    let j = min(ls[3] - p.t_base, p.count - 1u);
    return vec2<f32>(p.lrs[j >> 2u][j & 3u], p.alphas[j >> 2u][j & 3u]);
}

// The gradient the update sees: times the inverse scale ldexp(inverse_base, -e), which is
// 1 / ldexp(base, e) exactly (a power of two apart), as the host's unscale computes it.
fn unscaled(g: vec4<f32>) -> vec4<f32> {
    if (p.unscale == 0u) { return g; }
    return g * ldexp(p.inverse_base, -bitcast<i32>(ls[1]));
}

@compute @workgroup_size(256)
fn fused_update_ls(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (wid.x + wid.y * nwg.x >= p.n || ls[0] != 0u) { return; }
    let t = entry(wid, nwg);
    let first = 4u * lid.x;
    if (first >= t.len) { return; }
    let k = lid.x;
    let h = lr_alpha();
    var v: Vals;
    v.w = r0[t.w + k];
    if (uses_a()) { v.a = r0[t.a + k]; }
    if (uses_b()) { v.b = r0[t.b + k]; }
    if (uses_c()) { v.c = r0[t.c + k]; }
    let gi = clip_grad(unscaled(r0[t.g + k]));
    let o = keep_tail(v, update_at(v, gi, h.x, h.y), first, t.len);
    r0[t.w + k] = o.w;
    if (uses_a()) { r0[t.a + k] = o.a; }
    if (uses_b()) { r0[t.b + k] = o.b; }
    if (uses_c()) { r0[t.c + k] = o.c; }
}

@compute @workgroup_size(256)
fn fused_update_ls_regions(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (wid.x + wid.y * nwg.x >= p.n || ls[0] != 0u) { return; }
    let t = entry(wid, nwg);
    let first = 4u * lid.x;
    if (first >= t.len) { return; }
    let k = lid.x;
    let rw = t.regions & 3u;
    let rg = (t.regions >> 2u) & 3u;
    let ra = (t.regions >> 4u) & 3u;
    let rb = (t.regions >> 6u) & 3u;
    let rc = (t.regions >> 8u) & 3u;
    let h = lr_alpha();
    var v: Vals;
    v.w = ld2(rw, t.w + k);
    if (uses_a()) { v.a = ld2(ra, t.a + k); }
    if (uses_b()) { v.b = ld2(rb, t.b + k); }
    if (uses_c()) { v.c = ld2(rc, t.c + k); }
    let gi = clip_grad(unscaled(ld2(rg, t.g + k)));
    let o = keep_tail(v, update_at(v, gi, h.x, h.y), first, t.len);
    st2(rw, t.w + k, o.w);
    if (uses_a()) { st2(ra, t.a + k, o.a); }
    if (uses_b()) { st2(rb, t.b + k, o.b); }
    if (uses_c()) { st2(rc, t.c + k, o.c); }
}

// A gradient unscaled into a new tensor, flagging the step when an element is not finite (the
// check of a step whose gradients are clipped after unscaling): w = g * ldexp(inverse_base, -e).
@compute @workgroup_size(256)
fn loss_scale_unscale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let x = g[i];
    w[i] = x * ldexp(p.inverse_base, -bitcast<i32>(ls[1]));
    if ((bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u) {
        ls[0] = 1u;
    }
}

// The loss gradient's seed: w = ldexp(w * factor, e), which is w * ldexp(factor, e) exactly
// (a power of two apart), the host's `w * scale`.
@compute @workgroup_size(256)
fn loss_scale_seed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    // A new step: a flag that a failed step left set must not skip it.
    if (i == 0u) { ls[0] = 0u; }
    if (i >= p.n) { return; }
    w[i] = ldexp(w[i] * p.factor, bitcast<i32>(ls[1]));
}

// Keras' rules, after the update: a skipped step halves the scale and restarts the count; an
// applied one counts (iterations too) and doubles the scale after `growth` in a row, the
// exponent kept in [e_min, e_max] (a normal scale). Clears the flag for the next step (the
// seed clears it too, after a step that failed before this ran). One invocation.
@compute @workgroup_size(1)
fn loss_scale_advance() {
    var e = bitcast<i32>(ls[1]);
    if (ls[0] != 0u) {
        if (e > p.e_min) { e -= 1; }
        ls[2] = 0u;
    } else {
        ls[3] += 1u;
        if (ls[2] + 1u >= p.growth) {
            if (e < p.e_max) { e += 1; }
            ls[2] = 0u;
        } else {
            ls[2] += 1u;
        }
    }
    ls[1] = bitcast<u32>(e);
    ls[0] = 0u;
}
