// Matrix product with bias and activation fused into the output write:
//   out[m, n] = act(op(A) · op(B) + bias)
// where op(A) is A [m, k] or, with trans_a, the transpose of a stored [k, m] (likewise B).
//
// Entry points (matmul and matmul_v4 @workgroup_size(16, 16), dispatch (ceil(n / 64),
// ceil(m / 64), 1); matmul_16x8 below). Every tiled kernel but the split-k ones takes its row
// tile from row_tile(): more than 65,535 row tiles are dispatched as (x, 65,535, z).
//   matmul     any shapes and transposes (scalar loads);
//   matmul_v4  n and k multiples of 4, no transposes: each invocation computes 4 rows × one
//              vec4 of 4 adjacent columns, loading A, B and storing C as vec4 (bindings 7, 5, 6
//              view a, b and out as array<vec4<f32>>).
//   matmul_v4_splitk  matmul_v4 over one slice of k per workgroup layer: dispatch (ceil(n / 64),
//              ceil(m / 64), splits), slice z covers k4 in [z * k_slice, (z + 1) * k_slice)
//              (k_slice in vec4s of k), and writes its raw partial product to part4 at z * m * n / 4. For products with few output
//              tiles and a long k (a dense layer at batch 128: 4 tiles, k = 1152), which leave
//              a GPU's cores idle on one tile each.
//   matmul_splitk  matmul (any transposes) over one slice of k per workgroup layer, as
//              matmul_v4_splitk: slice z covers k in [z * k_slice, (z + 1) * k_slice), raw
//              partials to part at z * m * n.
//   splitk_reduce  out[i] = act(Σ_z part[z * m * n + i] + bias[i % n]) over k = splits layers;
//              @workgroup_size(256), dispatch grid_1d(m * n, 256).
//   splitk_reduce_v4  out4[i] = act(Σ_z part4[z * m * n / 4 + i] + bias) over k = splits layers,
//              i < m * n / 4 (n a multiple of 4); @workgroup_size(256), dispatch grid_1d.
//   matmul_smem_v4  matmul_v4's 64×64 tile and 4 rows × one vec4 per invocation, but the
//              tile's A (64 × 16) and B (16 × 64) pass through workgroup memory 16 steps of k at
//              a time, each loaded once by the workgroup with one vec4 per invocation (matmul_v4
//              has every invocation load its own, 16 times over the workgroup). For GPUs, whose
//              workgroup memory is on-chip; dispatch as matmul_v4.
//   matmul_smem128_v4  matmul_smem_v4 on 128×64 tiles (8 rows × one vec4 per invocation);
//              dispatch (ceil(n / 64), ceil(m / 128), 1). A second tile size for the tuner.
//   matmul_16x8  n and k multiples of 4, no transposes; @workgroup_size(8, 8), dispatch
//              (ceil(n / 64), ceil(m / 128), 1). For software adapters (lavapipe, llvmpipe),
//              which run 8 invocations as the lanes of one SIMD register, so that every
//              per-invocation load is a gather and loads, not multiply-adds, set the pace:
//              each invocation computes 16 rows (stride 8) × 2 vec4 columns (stride 8 vec4s),
//              512 multiply-adds per 4 steps of k from 16 vec4 loads of A and 8 of B. Measured
//              at 1024³ on lavapipe (2 cores), in GFLOP/s, for rows × vec4 columns per
//              invocation: 4×1 (matmul_v4) 4.4, 4×4 5.2, 8×2 7.4, 8×4 8.9, 16×1 11.6, 32×1 9.9,
//              32×2 12.6, 16×4 9.3, 16×2 14.5: more rows share each gathered B vector, until the
//              accumulators no longer fit in registers.
//   matmul_16x4  matmul_16x8 with one vec4 column per invocation, for n <= 32: dispatch
//              (ceil(n / 32), ceil(m / 128), 1); 128 rows × 32 columns a workgroup.
//   pack_b8    @workgroup_size(256), dispatch grid_1d(k * n, 256): B (any transpose, read
//              through b_rs, b_cs) into out as blocks of 8 columns, k rows each: out[(c * k + l) *
//              8 + q] = B(l, 8c + q). Each 32 rows of a block (1 KiB) are one window of
//              matmul_ubo8.
//   materialize @workgroup_size(256), dispatch grid_1d(k * n, 256): B (any transpose, read
//              through b_rs, b_cs) copied row-major into out [k, n] (an operand for the vec4
//              kernels, which take no transposes; A is bound as b for its copy).
//   matmul_ubo8  k a multiple of 32, n of 8, A not transposed; @workgroup_size(64), dispatch
//              grid_1d(m, 64) once per (column block `block`, slice of 32 rows of k `chunk`),
//              the chunks in order: binding 8 is that block's packed window of B as a uniform
//              buffer. Each invocation computes one row × 8 columns, adding to what earlier
//              chunks stored (chunk > 0); the last chunk adds the bias and applies act. For
//              software adapters (lavapipe 22.x): a storage load there costs a loop over the
//              SIMD lanes, while a uniform load at a constant offset is one scalar load and a
//              broadcast, so B comes from the window at offsets fixed in the code. Measured on
//              lavapipe (Zen 3) at 131072×32×32, CPU time per product: matmul_16x8 70-100 ms,
//              this 27-30 ms; unrolled over more than 32 rows of k, the offsets stop being
//              constants in the driver and the advantage is gone.
//
// matmul: Each invocation computes a 4×4 block of
// outputs held in registers; a workgroup covers 64×64. Rows and columns of a block are
// interleaved with stride 16 so that neighbouring invocations read neighbouring addresses of B
// and write neighbouring outputs. Dispatch: (ceil(n / 64), ceil(m / 64), 1).
//
// Bindings (group 0): 0 uniform Params; 1 a, 2 b, 3 bias ([n], read only when has_bias),
// 4 out: storage read_write array<f32>, row-major; 5 b4, 6 out4, 7 a4: vec4 views; 8 bw (a
// uniform window); 9 part, 10 part4: the split-k partials (float32 in the float16 twin).
// Params: m, k, n; a_rs, a_cs: strides of A(i, l) = a[i * a_rs + l * a_cs] (and b_rs, b_cs
// for B(l, j)), which encode the transposes; has_bias; act (0 linear, 1 relu, 2 selu); k_slice
// (matmul_v4_splitk only); block and chunk (matmul_ubo8 only).
// Limits: 256 invocations per workgroup, four storage buffers, 12 KiB of workgroup memory.

struct Params {
    m: u32,
    k: u32,
    n: u32,
    has_bias: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    act: u32,
    k_slice: u32,
    block: u32,
    chunk: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> a4: array<vec4<f32>>;
// matmul_ubo8's window of packed B: 32 rows of k × 8 columns.
@group(0) @binding(8) var<uniform> bw: array<vec4<f32>, 64>;
// The split-k kernels' raw partial products [splits, m, n]: float32 in the float16 twin too,
// so that a product's sum is rounded once, at the end.
@group(0) @binding(9) var<storage, read_write> part: array<f32>;
@group(0) @binding(10) var<storage, read_write> part4: array<vec4<f32>>;

const SELU_ALPHA: f32 = 1.6732632423543772;
const SELU_SCALE: f32 = 1.0507009873554805;

fn act(x: f32, kind: u32) -> f32 {
    switch kind {
        case 1u: { return max(x, 0.0); }
        case 2u: {
            if (x > 0.0) { return SELU_SCALE * x; }
            return SELU_SCALE * SELU_ALPHA * (exp(x) - 1.0);
        }
        default: { return x; }
    }
}

// The row tile of a workgroup: dispatches with more row tiles than one grid dimension holds
// (65,535) fold them into z; tiles past the last (the fold rounds up) clamp their rows and
// store nothing.
fn row_tile(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

// The 4×4 block of invocation (row0, col0) of the scalar kernels over k in [l_begin, l_end):
// rows row0 + 16i, columns col0 + 16j. Out-of-range rows and columns read a valid element
// (clamped) and are never written, so the inner loop needs no branches.
fn block_scalar(row0: u32, col0: u32, l_begin: u32, l_end: u32) -> array<vec4<f32>, 4> {
    var arow: array<u32, 4>;
    var bcol: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        arow[i] = min(row0 + 16u * i, p.m - 1u) * p.a_rs;
        bcol[i] = min(col0 + 16u * i, p.n - 1u) * p.b_cs;
    }
    var acc: array<vec4<f32>, 4>;
    for (var l = l_begin; l < l_end; l++) {
        let ao = l * p.a_cs;
        let bo = l * p.b_rs;
        let bv = vec4<f32>(b[bo + bcol[0]], b[bo + bcol[1]], b[bo + bcol[2]], b[bo + bcol[3]]);
        acc[0] += a[arow[0] + ao] * bv;
        acc[1] += a[arow[1] + ao] * bv;
        acc[2] += a[arow[2] + ao] * bv;
        acc[3] += a[arow[3] + ao] * bv;
    }
    return acc;
}

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = row_tile(wg, nwg) * 64u + lid.y;
    let col0 = wg.x * 64u + lid.x;
    let acc = block_scalar(row0, col0, 0u, p.k);
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + 16u * i;
        if (r >= p.m) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + 16u * j;
            if (c >= p.n) { break; }
            var v = acc[i][j];
            if (p.has_bias != 0u) { v += bias[c]; }
            out[r * p.n + c] = act(v, p.act);
        }
    }
}

fn act4(v: vec4<f32>, kind: u32) -> vec4<f32> {
    return vec4<f32>(act(v.x, kind), act(v.y, kind), act(v.z, kind), act(v.w, kind));
}

// The block of invocation (row0, vec4 column cv) of the vec4 kernels over k4 in
// [l_begin, l_end): rows row0 + 16i. k a multiple of 4 and A not transposed: A is read as vec4
// along k, so each step does 4 × 4 × 4 multiply-adds from 4 loads of A and 4 of B.
fn block_v4(row0: u32, cv: u32, l_begin: u32, l_end: u32) -> array<vec4<f32>, 4> {
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let cvc = min(cv, n4 - 1u);
    var arow: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        arow[i] = min(row0 + 16u * i, p.m - 1u) * k4;
    }
    var acc: array<vec4<f32>, 4>;
    for (var l4 = l_begin; l4 < l_end; l4++) {
        let b0 = b4[(4u * l4) * n4 + cvc];
        let b1 = b4[(4u * l4 + 1u) * n4 + cvc];
        let b2 = b4[(4u * l4 + 2u) * n4 + cvc];
        let b3 = b4[(4u * l4 + 3u) * n4 + cvc];
        for (var i = 0u; i < 4u; i++) {
            let av = a4[arow[i] + l4];
            acc[i] += av.x * b0 + av.y * b1 + av.z * b2 + av.w * b3;
        }
    }
    return acc;
}

// Writes act(acc + bias) for rows row0 + 16i of vec4 column cv.
fn store_v4(row0: u32, cv: u32, acc: array<vec4<f32>, 4>) {
    let n4 = p.n / 4u;
    if (cv >= n4) { return; }
    var bias4 = vec4<f32>(0.0);
    if (p.has_bias != 0u) {
        bias4 = vec4<f32>(bias[4u * cv], bias[4u * cv + 1u], bias[4u * cv + 2u], bias[4u * cv + 3u]);
    }
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + 16u * i;
        if (r >= p.m) { break; }
        out4[r * n4 + cv] = act4(acc[i] + bias4, p.act);
    }
}

@compute @workgroup_size(16, 16)
fn matmul_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let cv = wg.x * 16u + lid.x;
    let row0 = row_tile(wg, nwg) * 64u + lid.y;
    store_v4(row0, cv, block_v4(row0, cv, 0u, p.k / 4u));
}

// matmul_smem_v4 uses the first 256 vec4s of tile_a, matmul_smem128_v4 all 512.
var<workgroup> tile_a: array<vec4<f32>, 512>;
var<workgroup> tile_b: array<vec4<f32>, 256>;

@compute @workgroup_size(16, 16)
fn matmul_smem_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let cv = wg.x * 16u + lid.x;
    let row0 = row_tile(wg, nwg) * 64u;
    // What this invocation loads: A row li / 4, its vec4 li % 4 of the step's 16 k; B row
    // li / 16 of the step, vec4 column li % 16 of the tile.
    let a_row = min(row0 + li / 4u, p.m - 1u) * k4;
    let a_q = li % 4u;
    let b_r = li / 16u;
    let b_c = min(wg.x * 16u + li % 16u, n4 - 1u);
    var acc: array<vec4<f32>, 4>;
    for (var kk = 0u; kk < p.k; kk += 16u) {
        let aq = kk / 4u + a_q;
        var av = vec4<f32>(0.0);
        if (aq < k4) { av = a4[a_row + aq]; }
        tile_a[li] = av;
        let br = kk + b_r;
        var bv = vec4<f32>(0.0);
        if (br < p.k) { bv = b4[br * n4 + b_c]; }
        tile_b[li] = bv;
        workgroupBarrier();
        for (var q = 0u; q < 4u; q++) {
            let b0 = tile_b[(4u * q) * 16u + lid.x];
            let b1 = tile_b[(4u * q + 1u) * 16u + lid.x];
            let b2 = tile_b[(4u * q + 2u) * 16u + lid.x];
            let b3 = tile_b[(4u * q + 3u) * 16u + lid.x];
            for (var i = 0u; i < 4u; i++) {
                let a = tile_a[(lid.y + 16u * i) * 4u + q];
                acc[i] += a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
            }
        }
        workgroupBarrier();
    }
    store_v4(row0 + lid.y, cv, acc);
}

@compute @workgroup_size(16, 16)
fn matmul_smem128_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // matmul_smem_v4 on a 128×64 tile: 8 rows (stride 16) × one vec4 per invocation, each
    // tile_b vector read from workgroup memory feeding twice the multiply-adds.
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let cv = wg.x * 16u + lid.x;
    let row0 = row_tile(wg, nwg) * 128u;
    // A rows li / 4 and 64 + li / 4, vec4 li % 4 of the step's 16 k; B as matmul_smem_v4.
    let a_row0 = min(row0 + li / 4u, p.m - 1u) * k4;
    let a_row1 = min(row0 + 64u + li / 4u, p.m - 1u) * k4;
    let a_q = li % 4u;
    let b_r = li / 16u;
    let b_c = min(wg.x * 16u + li % 16u, n4 - 1u);
    var acc: array<vec4<f32>, 8>;
    for (var kk = 0u; kk < p.k; kk += 16u) {
        let aq = kk / 4u + a_q;
        var av0 = vec4<f32>(0.0);
        var av1 = vec4<f32>(0.0);
        if (aq < k4) {
            av0 = a4[a_row0 + aq];
            av1 = a4[a_row1 + aq];
        }
        tile_a[li] = av0;
        tile_a[256u + li] = av1;
        let br = kk + b_r;
        var bv = vec4<f32>(0.0);
        if (br < p.k) { bv = b4[br * n4 + b_c]; }
        tile_b[li] = bv;
        workgroupBarrier();
        for (var q = 0u; q < 4u; q++) {
            let b0 = tile_b[(4u * q) * 16u + lid.x];
            let b1 = tile_b[(4u * q + 1u) * 16u + lid.x];
            let b2 = tile_b[(4u * q + 2u) * 16u + lid.x];
            let b3 = tile_b[(4u * q + 3u) * 16u + lid.x];
            for (var i = 0u; i < 8u; i++) {
                let a = tile_a[(lid.y + 16u * i) * 4u + q];
                acc[i] += a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
            }
        }
        workgroupBarrier();
    }
    store_v4(row0 + lid.y, cv, array<vec4<f32>, 4>(acc[0], acc[1], acc[2], acc[3]));
    store_v4(row0 + 64u + lid.y, cv, array<vec4<f32>, 4>(acc[4], acc[5], acc[6], acc[7]));
}

@compute @workgroup_size(16, 16)
fn matmul_v4_splitk(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n4 = p.n / 4u;
    let l_begin = wg.z * p.k_slice;
    let l_end = min(l_begin + p.k_slice, p.k / 4u);
    let cv = wg.x * 16u + lid.x;
    let row0 = wg.y * 64u + lid.y;
    let acc = block_v4(row0, cv, l_begin, l_end);
    if (cv >= n4) { return; }
    let layer = wg.z * p.m * n4;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + 16u * i;
        if (r >= p.m) { break; }
        part4[layer + r * n4 + cv] = acc[i];
    }
}

@compute @workgroup_size(16, 16)
fn matmul_splitk(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = wg.y * 64u + lid.y;
    let col0 = wg.x * 64u + lid.x;
    let l_begin = wg.z * p.k_slice;
    let acc = block_scalar(row0, col0, l_begin, min(l_begin + p.k_slice, p.k));
    let layer = wg.z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + 16u * i;
        if (r >= p.m) { break; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + 16u * j;
            if (c >= p.n) { break; }
            part[layer + r * p.n + c] = acc[i][j];
        }
    }
}

@compute @workgroup_size(256)
fn splitk_reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let len = p.m * p.n;
    if (i >= len) { return; }
    var s = 0.0;
    for (var z = 0u; z < p.k; z++) {
        s += part[z * len + i];
    }
    if (p.has_bias != 0u) {
        s += bias[i % p.n];
    }
    out[i] = act(s, p.act);
}

@compute @workgroup_size(256)
fn splitk_reduce_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let n4 = p.n / 4u;
    let len4 = p.m * n4;
    if (i >= len4) { return; }
    var s = vec4<f32>(0.0);
    for (var z = 0u; z < p.k; z++) {
        s += part4[z * len4 + i];
    }
    if (p.has_bias != 0u) {
        let c = 4u * (i % n4);
        s += vec4<f32>(bias[c], bias[c + 1u], bias[c + 2u], bias[c + 3u]);
    }
    out4[i] = act4(s, p.act);
}

@compute @workgroup_size(8, 8)
fn matmul_16x8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let c0 = wg.x * 16u + lid.x;
    let cc0 = min(c0 + 0u, n4 - 1u);
    let cc1 = min(c0 + 8u, n4 - 1u);
    let row0 = row_tile(wg, nwg) * 128u + lid.y;
    let r0 = min(row0 + 0u, p.m - 1u) * k4;
    let r1 = min(row0 + 8u, p.m - 1u) * k4;
    let r2 = min(row0 + 16u, p.m - 1u) * k4;
    let r3 = min(row0 + 24u, p.m - 1u) * k4;
    let r4 = min(row0 + 32u, p.m - 1u) * k4;
    let r5 = min(row0 + 40u, p.m - 1u) * k4;
    let r6 = min(row0 + 48u, p.m - 1u) * k4;
    let r7 = min(row0 + 56u, p.m - 1u) * k4;
    let r8 = min(row0 + 64u, p.m - 1u) * k4;
    let r9 = min(row0 + 72u, p.m - 1u) * k4;
    let r10 = min(row0 + 80u, p.m - 1u) * k4;
    let r11 = min(row0 + 88u, p.m - 1u) * k4;
    let r12 = min(row0 + 96u, p.m - 1u) * k4;
    let r13 = min(row0 + 104u, p.m - 1u) * k4;
    let r14 = min(row0 + 112u, p.m - 1u) * k4;
    let r15 = min(row0 + 120u, p.m - 1u) * k4;
    // The accumulators, indexed by constants only, so they stay in registers.
    var acc: array<vec4<f32>, 32>;
    var bo = 0u;
    for (var l4 = 0u; l4 < k4; l4++) {
        let b0_0 = b4[bo + cc0];
        let b0_1 = b4[bo + cc1];
        let b1_0 = b4[bo + 1u * n4 + cc0];
        let b1_1 = b4[bo + 1u * n4 + cc1];
        let b2_0 = b4[bo + 2u * n4 + cc0];
        let b2_1 = b4[bo + 2u * n4 + cc1];
        let b3_0 = b4[bo + 3u * n4 + cc0];
        let b3_1 = b4[bo + 3u * n4 + cc1];
        bo += 4u * n4;
        let av0 = a4[r0 + l4];
        acc[0] += av0.x * b0_0 + av0.y * b1_0 + av0.z * b2_0 + av0.w * b3_0;
        acc[1] += av0.x * b0_1 + av0.y * b1_1 + av0.z * b2_1 + av0.w * b3_1;
        let av1 = a4[r1 + l4];
        acc[2] += av1.x * b0_0 + av1.y * b1_0 + av1.z * b2_0 + av1.w * b3_0;
        acc[3] += av1.x * b0_1 + av1.y * b1_1 + av1.z * b2_1 + av1.w * b3_1;
        let av2 = a4[r2 + l4];
        acc[4] += av2.x * b0_0 + av2.y * b1_0 + av2.z * b2_0 + av2.w * b3_0;
        acc[5] += av2.x * b0_1 + av2.y * b1_1 + av2.z * b2_1 + av2.w * b3_1;
        let av3 = a4[r3 + l4];
        acc[6] += av3.x * b0_0 + av3.y * b1_0 + av3.z * b2_0 + av3.w * b3_0;
        acc[7] += av3.x * b0_1 + av3.y * b1_1 + av3.z * b2_1 + av3.w * b3_1;
        let av4 = a4[r4 + l4];
        acc[8] += av4.x * b0_0 + av4.y * b1_0 + av4.z * b2_0 + av4.w * b3_0;
        acc[9] += av4.x * b0_1 + av4.y * b1_1 + av4.z * b2_1 + av4.w * b3_1;
        let av5 = a4[r5 + l4];
        acc[10] += av5.x * b0_0 + av5.y * b1_0 + av5.z * b2_0 + av5.w * b3_0;
        acc[11] += av5.x * b0_1 + av5.y * b1_1 + av5.z * b2_1 + av5.w * b3_1;
        let av6 = a4[r6 + l4];
        acc[12] += av6.x * b0_0 + av6.y * b1_0 + av6.z * b2_0 + av6.w * b3_0;
        acc[13] += av6.x * b0_1 + av6.y * b1_1 + av6.z * b2_1 + av6.w * b3_1;
        let av7 = a4[r7 + l4];
        acc[14] += av7.x * b0_0 + av7.y * b1_0 + av7.z * b2_0 + av7.w * b3_0;
        acc[15] += av7.x * b0_1 + av7.y * b1_1 + av7.z * b2_1 + av7.w * b3_1;
        let av8 = a4[r8 + l4];
        acc[16] += av8.x * b0_0 + av8.y * b1_0 + av8.z * b2_0 + av8.w * b3_0;
        acc[17] += av8.x * b0_1 + av8.y * b1_1 + av8.z * b2_1 + av8.w * b3_1;
        let av9 = a4[r9 + l4];
        acc[18] += av9.x * b0_0 + av9.y * b1_0 + av9.z * b2_0 + av9.w * b3_0;
        acc[19] += av9.x * b0_1 + av9.y * b1_1 + av9.z * b2_1 + av9.w * b3_1;
        let av10 = a4[r10 + l4];
        acc[20] += av10.x * b0_0 + av10.y * b1_0 + av10.z * b2_0 + av10.w * b3_0;
        acc[21] += av10.x * b0_1 + av10.y * b1_1 + av10.z * b2_1 + av10.w * b3_1;
        let av11 = a4[r11 + l4];
        acc[22] += av11.x * b0_0 + av11.y * b1_0 + av11.z * b2_0 + av11.w * b3_0;
        acc[23] += av11.x * b0_1 + av11.y * b1_1 + av11.z * b2_1 + av11.w * b3_1;
        let av12 = a4[r12 + l4];
        acc[24] += av12.x * b0_0 + av12.y * b1_0 + av12.z * b2_0 + av12.w * b3_0;
        acc[25] += av12.x * b0_1 + av12.y * b1_1 + av12.z * b2_1 + av12.w * b3_1;
        let av13 = a4[r13 + l4];
        acc[26] += av13.x * b0_0 + av13.y * b1_0 + av13.z * b2_0 + av13.w * b3_0;
        acc[27] += av13.x * b0_1 + av13.y * b1_1 + av13.z * b2_1 + av13.w * b3_1;
        let av14 = a4[r14 + l4];
        acc[28] += av14.x * b0_0 + av14.y * b1_0 + av14.z * b2_0 + av14.w * b3_0;
        acc[29] += av14.x * b0_1 + av14.y * b1_1 + av14.z * b2_1 + av14.w * b3_1;
        let av15 = a4[r15 + l4];
        acc[30] += av15.x * b0_0 + av15.y * b1_0 + av15.z * b2_0 + av15.w * b3_0;
        acc[31] += av15.x * b0_1 + av15.y * b1_1 + av15.z * b2_1 + av15.w * b3_1;
    }
    var bias0 = vec4<f32>(0.0);
    var bias1 = vec4<f32>(0.0);
    if (p.has_bias != 0u) {
        bias0 = vec4<f32>(bias[4u * cc0], bias[4u * cc0 + 1u], bias[4u * cc0 + 2u], bias[4u * cc0 + 3u]);
        bias1 = vec4<f32>(bias[4u * cc1], bias[4u * cc1 + 1u], bias[4u * cc1 + 2u], bias[4u * cc1 + 3u]);
    }
    if (row0 + 0u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 0u) * n4 + c0 + 0u] = act4(acc[0] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 0u) * n4 + c0 + 8u] = act4(acc[1] + bias1, p.act); }
    }
    if (row0 + 8u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 8u) * n4 + c0 + 0u] = act4(acc[2] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 8u) * n4 + c0 + 8u] = act4(acc[3] + bias1, p.act); }
    }
    if (row0 + 16u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 16u) * n4 + c0 + 0u] = act4(acc[4] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 16u) * n4 + c0 + 8u] = act4(acc[5] + bias1, p.act); }
    }
    if (row0 + 24u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 24u) * n4 + c0 + 0u] = act4(acc[6] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 24u) * n4 + c0 + 8u] = act4(acc[7] + bias1, p.act); }
    }
    if (row0 + 32u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 32u) * n4 + c0 + 0u] = act4(acc[8] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 32u) * n4 + c0 + 8u] = act4(acc[9] + bias1, p.act); }
    }
    if (row0 + 40u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 40u) * n4 + c0 + 0u] = act4(acc[10] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 40u) * n4 + c0 + 8u] = act4(acc[11] + bias1, p.act); }
    }
    if (row0 + 48u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 48u) * n4 + c0 + 0u] = act4(acc[12] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 48u) * n4 + c0 + 8u] = act4(acc[13] + bias1, p.act); }
    }
    if (row0 + 56u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 56u) * n4 + c0 + 0u] = act4(acc[14] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 56u) * n4 + c0 + 8u] = act4(acc[15] + bias1, p.act); }
    }
    if (row0 + 64u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 64u) * n4 + c0 + 0u] = act4(acc[16] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 64u) * n4 + c0 + 8u] = act4(acc[17] + bias1, p.act); }
    }
    if (row0 + 72u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 72u) * n4 + c0 + 0u] = act4(acc[18] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 72u) * n4 + c0 + 8u] = act4(acc[19] + bias1, p.act); }
    }
    if (row0 + 80u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 80u) * n4 + c0 + 0u] = act4(acc[20] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 80u) * n4 + c0 + 8u] = act4(acc[21] + bias1, p.act); }
    }
    if (row0 + 88u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 88u) * n4 + c0 + 0u] = act4(acc[22] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 88u) * n4 + c0 + 8u] = act4(acc[23] + bias1, p.act); }
    }
    if (row0 + 96u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 96u) * n4 + c0 + 0u] = act4(acc[24] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 96u) * n4 + c0 + 8u] = act4(acc[25] + bias1, p.act); }
    }
    if (row0 + 104u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 104u) * n4 + c0 + 0u] = act4(acc[26] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 104u) * n4 + c0 + 8u] = act4(acc[27] + bias1, p.act); }
    }
    if (row0 + 112u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 112u) * n4 + c0 + 0u] = act4(acc[28] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 112u) * n4 + c0 + 8u] = act4(acc[29] + bias1, p.act); }
    }
    if (row0 + 120u < p.m) {
        if (c0 + 0u < n4) { out4[(row0 + 120u) * n4 + c0 + 0u] = act4(acc[30] + bias0, p.act); }
        if (c0 + 8u < n4) { out4[(row0 + 120u) * n4 + c0 + 8u] = act4(acc[31] + bias1, p.act); }
    }
}

// matmul_16x8 with one vec4 column per invocation: a workgroup covers 128 rows × 32 columns, for
// products 32 columns wide or narrower, where matmul_16x8's second vec4 column (and the 64-column
// tiles of the other kernels) would compute clamped columns only to throw them away.
@compute @workgroup_size(8, 8)
fn matmul_16x4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let c0 = wg.x * 8u + lid.x;
    let cc0 = min(c0, n4 - 1u);
    let row0 = row_tile(wg, nwg) * 128u + lid.y;
    let r0 = min(row0 + 0u, p.m - 1u) * k4;
    let r1 = min(row0 + 8u, p.m - 1u) * k4;
    let r2 = min(row0 + 16u, p.m - 1u) * k4;
    let r3 = min(row0 + 24u, p.m - 1u) * k4;
    let r4 = min(row0 + 32u, p.m - 1u) * k4;
    let r5 = min(row0 + 40u, p.m - 1u) * k4;
    let r6 = min(row0 + 48u, p.m - 1u) * k4;
    let r7 = min(row0 + 56u, p.m - 1u) * k4;
    let r8 = min(row0 + 64u, p.m - 1u) * k4;
    let r9 = min(row0 + 72u, p.m - 1u) * k4;
    let r10 = min(row0 + 80u, p.m - 1u) * k4;
    let r11 = min(row0 + 88u, p.m - 1u) * k4;
    let r12 = min(row0 + 96u, p.m - 1u) * k4;
    let r13 = min(row0 + 104u, p.m - 1u) * k4;
    let r14 = min(row0 + 112u, p.m - 1u) * k4;
    let r15 = min(row0 + 120u, p.m - 1u) * k4;
    // The accumulators, indexed by constants only, so they stay in registers.
    var acc: array<vec4<f32>, 16>;
    var bo = 0u;
    for (var l4 = 0u; l4 < k4; l4++) {
        let b0 = b4[bo + cc0];
        let b1 = b4[bo + n4 + cc0];
        let b2 = b4[bo + 2u * n4 + cc0];
        let b3 = b4[bo + 3u * n4 + cc0];
        bo += 4u * n4;
        let av0 = a4[r0 + l4];
        acc[0] += av0.x * b0 + av0.y * b1 + av0.z * b2 + av0.w * b3;
        let av1 = a4[r1 + l4];
        acc[1] += av1.x * b0 + av1.y * b1 + av1.z * b2 + av1.w * b3;
        let av2 = a4[r2 + l4];
        acc[2] += av2.x * b0 + av2.y * b1 + av2.z * b2 + av2.w * b3;
        let av3 = a4[r3 + l4];
        acc[3] += av3.x * b0 + av3.y * b1 + av3.z * b2 + av3.w * b3;
        let av4 = a4[r4 + l4];
        acc[4] += av4.x * b0 + av4.y * b1 + av4.z * b2 + av4.w * b3;
        let av5 = a4[r5 + l4];
        acc[5] += av5.x * b0 + av5.y * b1 + av5.z * b2 + av5.w * b3;
        let av6 = a4[r6 + l4];
        acc[6] += av6.x * b0 + av6.y * b1 + av6.z * b2 + av6.w * b3;
        let av7 = a4[r7 + l4];
        acc[7] += av7.x * b0 + av7.y * b1 + av7.z * b2 + av7.w * b3;
        let av8 = a4[r8 + l4];
        acc[8] += av8.x * b0 + av8.y * b1 + av8.z * b2 + av8.w * b3;
        let av9 = a4[r9 + l4];
        acc[9] += av9.x * b0 + av9.y * b1 + av9.z * b2 + av9.w * b3;
        let av10 = a4[r10 + l4];
        acc[10] += av10.x * b0 + av10.y * b1 + av10.z * b2 + av10.w * b3;
        let av11 = a4[r11 + l4];
        acc[11] += av11.x * b0 + av11.y * b1 + av11.z * b2 + av11.w * b3;
        let av12 = a4[r12 + l4];
        acc[12] += av12.x * b0 + av12.y * b1 + av12.z * b2 + av12.w * b3;
        let av13 = a4[r13 + l4];
        acc[13] += av13.x * b0 + av13.y * b1 + av13.z * b2 + av13.w * b3;
        let av14 = a4[r14 + l4];
        acc[14] += av14.x * b0 + av14.y * b1 + av14.z * b2 + av14.w * b3;
        let av15 = a4[r15 + l4];
        acc[15] += av15.x * b0 + av15.y * b1 + av15.z * b2 + av15.w * b3;
    }
    if (c0 >= n4) { return; }
    var bias0 = vec4<f32>(0.0);
    if (p.has_bias != 0u) {
        bias0 = vec4<f32>(bias[4u * c0], bias[4u * c0 + 1u], bias[4u * c0 + 2u], bias[4u * c0 + 3u]);
    }
    if (row0 + 0u < p.m) { out4[(row0 + 0u) * n4 + c0] = act4(acc[0] + bias0, p.act); }
    if (row0 + 8u < p.m) { out4[(row0 + 8u) * n4 + c0] = act4(acc[1] + bias0, p.act); }
    if (row0 + 16u < p.m) { out4[(row0 + 16u) * n4 + c0] = act4(acc[2] + bias0, p.act); }
    if (row0 + 24u < p.m) { out4[(row0 + 24u) * n4 + c0] = act4(acc[3] + bias0, p.act); }
    if (row0 + 32u < p.m) { out4[(row0 + 32u) * n4 + c0] = act4(acc[4] + bias0, p.act); }
    if (row0 + 40u < p.m) { out4[(row0 + 40u) * n4 + c0] = act4(acc[5] + bias0, p.act); }
    if (row0 + 48u < p.m) { out4[(row0 + 48u) * n4 + c0] = act4(acc[6] + bias0, p.act); }
    if (row0 + 56u < p.m) { out4[(row0 + 56u) * n4 + c0] = act4(acc[7] + bias0, p.act); }
    if (row0 + 64u < p.m) { out4[(row0 + 64u) * n4 + c0] = act4(acc[8] + bias0, p.act); }
    if (row0 + 72u < p.m) { out4[(row0 + 72u) * n4 + c0] = act4(acc[9] + bias0, p.act); }
    if (row0 + 80u < p.m) { out4[(row0 + 80u) * n4 + c0] = act4(acc[10] + bias0, p.act); }
    if (row0 + 88u < p.m) { out4[(row0 + 88u) * n4 + c0] = act4(acc[11] + bias0, p.act); }
    if (row0 + 96u < p.m) { out4[(row0 + 96u) * n4 + c0] = act4(acc[12] + bias0, p.act); }
    if (row0 + 104u < p.m) { out4[(row0 + 104u) * n4 + c0] = act4(acc[13] + bias0, p.act); }
    if (row0 + 112u < p.m) { out4[(row0 + 112u) * n4 + c0] = act4(acc[14] + bias0, p.act); }
    if (row0 + 120u < p.m) { out4[(row0 + 120u) * n4 + c0] = act4(acc[15] + bias0, p.act); }
}

@compute @workgroup_size(8, 8)
fn matmul_tall(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    // Columns col0 + 8j (j < 8) and rows row0 + 8i (i < 16): neighbouring invocations touch
    // neighbouring columns. Out-of-range rows and columns read a clamped, valid element and
    // are never written.
    let col0 = wg.x * 64u + lid.x;
    let row0 = row_tile(wg, nwg) * 128u + lid.y;
    let bc0 = vec4<u32>(min(col0 + 0u, p.n - 1u), min(col0 + 8u, p.n - 1u), min(col0 + 16u, p.n - 1u), min(col0 + 24u, p.n - 1u)) * p.b_cs;
    let bc1 = vec4<u32>(min(col0 + 32u, p.n - 1u), min(col0 + 40u, p.n - 1u), min(col0 + 48u, p.n - 1u), min(col0 + 56u, p.n - 1u)) * p.b_cs;
    let ra0 = min(row0 + 0u, p.m - 1u) * p.a_rs;
    let ra1 = min(row0 + 8u, p.m - 1u) * p.a_rs;
    let ra2 = min(row0 + 16u, p.m - 1u) * p.a_rs;
    let ra3 = min(row0 + 24u, p.m - 1u) * p.a_rs;
    let ra4 = min(row0 + 32u, p.m - 1u) * p.a_rs;
    let ra5 = min(row0 + 40u, p.m - 1u) * p.a_rs;
    let ra6 = min(row0 + 48u, p.m - 1u) * p.a_rs;
    let ra7 = min(row0 + 56u, p.m - 1u) * p.a_rs;
    let ra8 = min(row0 + 64u, p.m - 1u) * p.a_rs;
    let ra9 = min(row0 + 72u, p.m - 1u) * p.a_rs;
    let ra10 = min(row0 + 80u, p.m - 1u) * p.a_rs;
    let ra11 = min(row0 + 88u, p.m - 1u) * p.a_rs;
    let ra12 = min(row0 + 96u, p.m - 1u) * p.a_rs;
    let ra13 = min(row0 + 104u, p.m - 1u) * p.a_rs;
    let ra14 = min(row0 + 112u, p.m - 1u) * p.a_rs;
    let ra15 = min(row0 + 120u, p.m - 1u) * p.a_rs;
    // The accumulators, indexed by constants only, so they stay in registers.
    var acc: array<vec4<f32>, 32>;
    for (var l = 0u; l < p.k; l++) {
        let bo = l * p.b_rs;
        let ao = l * p.a_cs;
        let bv0 = vec4<f32>(b[bo + bc0.x], b[bo + bc0.y], b[bo + bc0.z], b[bo + bc0.w]);
        let bv1 = vec4<f32>(b[bo + bc1.x], b[bo + bc1.y], b[bo + bc1.z], b[bo + bc1.w]);
        let av0 = a[ra0 + ao];
        acc[0] += av0 * bv0;
        acc[1] += av0 * bv1;
        let av1 = a[ra1 + ao];
        acc[2] += av1 * bv0;
        acc[3] += av1 * bv1;
        let av2 = a[ra2 + ao];
        acc[4] += av2 * bv0;
        acc[5] += av2 * bv1;
        let av3 = a[ra3 + ao];
        acc[6] += av3 * bv0;
        acc[7] += av3 * bv1;
        let av4 = a[ra4 + ao];
        acc[8] += av4 * bv0;
        acc[9] += av4 * bv1;
        let av5 = a[ra5 + ao];
        acc[10] += av5 * bv0;
        acc[11] += av5 * bv1;
        let av6 = a[ra6 + ao];
        acc[12] += av6 * bv0;
        acc[13] += av6 * bv1;
        let av7 = a[ra7 + ao];
        acc[14] += av7 * bv0;
        acc[15] += av7 * bv1;
        let av8 = a[ra8 + ao];
        acc[16] += av8 * bv0;
        acc[17] += av8 * bv1;
        let av9 = a[ra9 + ao];
        acc[18] += av9 * bv0;
        acc[19] += av9 * bv1;
        let av10 = a[ra10 + ao];
        acc[20] += av10 * bv0;
        acc[21] += av10 * bv1;
        let av11 = a[ra11 + ao];
        acc[22] += av11 * bv0;
        acc[23] += av11 * bv1;
        let av12 = a[ra12 + ao];
        acc[24] += av12 * bv0;
        acc[25] += av12 * bv1;
        let av13 = a[ra13 + ao];
        acc[26] += av13 * bv0;
        acc[27] += av13 * bv1;
        let av14 = a[ra14 + ao];
        acc[28] += av14 * bv0;
        acc[29] += av14 * bv1;
        let av15 = a[ra15 + ao];
        acc[30] += av15 * bv0;
        acc[31] += av15 * bv1;
    }
    store_tall(row0 + 0u, col0, acc[0], acc[1]);
    store_tall(row0 + 8u, col0, acc[2], acc[3]);
    store_tall(row0 + 16u, col0, acc[4], acc[5]);
    store_tall(row0 + 24u, col0, acc[6], acc[7]);
    store_tall(row0 + 32u, col0, acc[8], acc[9]);
    store_tall(row0 + 40u, col0, acc[10], acc[11]);
    store_tall(row0 + 48u, col0, acc[12], acc[13]);
    store_tall(row0 + 56u, col0, acc[14], acc[15]);
    store_tall(row0 + 64u, col0, acc[16], acc[17]);
    store_tall(row0 + 72u, col0, acc[18], acc[19]);
    store_tall(row0 + 80u, col0, acc[20], acc[21]);
    store_tall(row0 + 88u, col0, acc[22], acc[23]);
    store_tall(row0 + 96u, col0, acc[24], acc[25]);
    store_tall(row0 + 104u, col0, acc[26], acc[27]);
    store_tall(row0 + 112u, col0, acc[28], acc[29]);
    store_tall(row0 + 120u, col0, acc[30], acc[31]);
}

// One row of matmul_tall's block: columns col0 + 8j, j < 8, those in range.
fn store_tall(r: u32, col0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (r >= p.m) { return; }
    for (var j = 0u; j < 8u; j++) {
        let c = col0 + 8u * j;
        if (c >= p.n) { return; }
        var v = select(hi[j - 4u], lo[j], j < 4u);
        if (p.has_bias != 0u) { v += bias[c]; }
        out[r * p.n + c] = act(v, p.act);
    }
}

@compute @workgroup_size(256)
fn materialize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.k * p.n) { return; }
    out[i] = b[(i / p.n) * p.b_rs + (i % p.n) * p.b_cs];
}

@compute @workgroup_size(256)
fn pack_b8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.k * p.n) { return; }
    let q = i % 8u;
    let l = (i / 8u) % p.k;
    let c = i / (8u * p.k);
    out[i] = b[l * p.b_rs + (8u * c + q) * p.b_cs];
}

@compute @workgroup_size(64)
fn matmul_ubo8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Rows past m compute a copy of the last row and store nothing: an early return would
    // leave the lanes divergent, and lavapipe then loads the window lane by lane.
    let flat_row = gid.x + gid.y * nwg.x * 64u;
    let row = min(flat_row, p.m - 1u);
    let n4 = p.n / 4u;
    let o = row * n4 + 2u * p.block;
    let a0 = row * (p.k / 4u) + 8u * p.chunk;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    if (p.chunk > 0u) {
        acc0 = out4[o];
        acc1 = out4[o + 1u];
    }
    // Written out, not looped: the window's offsets must be constants (see the header).
    let v0 = a4[a0 + 0u];
    acc0 += v0.x * bw[0] + v0.y * bw[2] + v0.z * bw[4] + v0.w * bw[6];
    acc1 += v0.x * bw[1] + v0.y * bw[3] + v0.z * bw[5] + v0.w * bw[7];
    let v1 = a4[a0 + 1u];
    acc0 += v1.x * bw[8] + v1.y * bw[10] + v1.z * bw[12] + v1.w * bw[14];
    acc1 += v1.x * bw[9] + v1.y * bw[11] + v1.z * bw[13] + v1.w * bw[15];
    let v2 = a4[a0 + 2u];
    acc0 += v2.x * bw[16] + v2.y * bw[18] + v2.z * bw[20] + v2.w * bw[22];
    acc1 += v2.x * bw[17] + v2.y * bw[19] + v2.z * bw[21] + v2.w * bw[23];
    let v3 = a4[a0 + 3u];
    acc0 += v3.x * bw[24] + v3.y * bw[26] + v3.z * bw[28] + v3.w * bw[30];
    acc1 += v3.x * bw[25] + v3.y * bw[27] + v3.z * bw[29] + v3.w * bw[31];
    let v4 = a4[a0 + 4u];
    acc0 += v4.x * bw[32] + v4.y * bw[34] + v4.z * bw[36] + v4.w * bw[38];
    acc1 += v4.x * bw[33] + v4.y * bw[35] + v4.z * bw[37] + v4.w * bw[39];
    let v5 = a4[a0 + 5u];
    acc0 += v5.x * bw[40] + v5.y * bw[42] + v5.z * bw[44] + v5.w * bw[46];
    acc1 += v5.x * bw[41] + v5.y * bw[43] + v5.z * bw[45] + v5.w * bw[47];
    let v6 = a4[a0 + 6u];
    acc0 += v6.x * bw[48] + v6.y * bw[50] + v6.z * bw[52] + v6.w * bw[54];
    acc1 += v6.x * bw[49] + v6.y * bw[51] + v6.z * bw[53] + v6.w * bw[55];
    let v7 = a4[a0 + 7u];
    acc0 += v7.x * bw[56] + v7.y * bw[58] + v7.z * bw[60] + v7.w * bw[62];
    acc1 += v7.x * bw[57] + v7.y * bw[59] + v7.z * bw[61] + v7.w * bw[63];
    if (p.chunk + 1u == p.k / 32u) {
        if (p.has_bias != 0u) {
            let c = 8u * p.block;
            acc0 += vec4<f32>(bias[c], bias[c + 1u], bias[c + 2u], bias[c + 3u]);
            acc1 += vec4<f32>(bias[c + 4u], bias[c + 5u], bias[c + 6u], bias[c + 7u]);
        }
        acc0 = act4(acc0, p.act);
        acc1 = act4(acc1, p.act);
    }
    if (flat_row < p.m) {
        out4[o] = acc0;
        out4[o + 1u] = acc1;
    }
}
