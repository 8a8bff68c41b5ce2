// Matrix product with bias and activation fused into the output write:
//   out[m, n] = act(op(A) · op(B) + bias)
// where op(A) is A [m, k] or, with trans_a, the transpose of a stored [k, m] (likewise B).
//
// Entry points, both @workgroup_size(16, 16), dispatch (ceil(n / 64), ceil(m / 64), 1):
//   matmul     any shapes and transposes (scalar loads);
//   matmul_v4  n and k multiples of 4, no transposes: each invocation computes 4 rows × one
//              vec4 of 4 adjacent columns, loading A, B and storing C as vec4 (bindings 7, 5, 6
//              view a, b and out as array<vec4<f32>>).
//
// matmul: Each invocation computes a 4×4 block of
// outputs held in registers; a workgroup covers 64×64. Rows and columns of a block are
// interleaved with stride 16 so that neighbouring invocations read neighbouring addresses of B
// and write neighbouring outputs. Dispatch: (ceil(n / 64), ceil(m / 64), 1).
//
// Bindings (group 0): 0 uniform Params; 1 a, 2 b, 3 bias ([n], read only when has_bias),
// 4 out: storage read_write array<f32>, row-major.
// Params: m, k, n; a_rs, a_cs: strides of A(i, l) = a[i * a_rs + l * a_cs] (and b_rs, b_cs
// for B(l, j)), which encode the transposes; has_bias; act (0 linear, 1 relu, 2 selu).
// Limits: 256 invocations per workgroup, four storage buffers.

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
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> a4: array<vec4<f32>>;

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

@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row0 = wg.y * 64u + lid.y;
    let col0 = wg.x * 64u + lid.x;
    // Out-of-range rows and columns read a valid element (clamped) and are never written, so
    // the inner loop needs no branches.
    var arow: array<u32, 4>;
    var bcol: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        arow[i] = min(row0 + 16u * i, p.m - 1u) * p.a_rs;
        bcol[i] = min(col0 + 16u * i, p.n - 1u) * p.b_cs;
    }
    var acc: array<vec4<f32>, 4>;
    for (var l = 0u; l < p.k; l++) {
        let ao = l * p.a_cs;
        let bo = l * p.b_rs;
        let bv = vec4<f32>(b[bo + bcol[0]], b[bo + bcol[1]], b[bo + bcol[2]], b[bo + bcol[3]]);
        acc[0] += a[arow[0] + ao] * bv;
        acc[1] += a[arow[1] + ao] * bv;
        acc[2] += a[arow[2] + ao] * bv;
        acc[3] += a[arow[3] + ao] * bv;
    }
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

@compute @workgroup_size(16, 16)
fn matmul_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    // k a multiple of 4 and A not transposed too: A is read as vec4 along k, so each step of
    // the loop does 4 × 4 × 4 multiply-adds from 4 loads of A and 4 of B.
    let n4 = p.n / 4u;
    let k4 = p.k / 4u;
    let cv = wg.x * 16u + lid.x;
    let row0 = wg.y * 64u + lid.y;
    let cvc = min(cv, n4 - 1u);
    var arow: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        arow[i] = min(row0 + 16u * i, p.m - 1u) * k4;
    }
    var acc: array<vec4<f32>, 4>;
    for (var l4 = 0u; l4 < k4; l4++) {
        let b0 = b4[(4u * l4) * n4 + cvc];
        let b1 = b4[(4u * l4 + 1u) * n4 + cvc];
        let b2 = b4[(4u * l4 + 2u) * n4 + cvc];
        let b3 = b4[(4u * l4 + 3u) * n4 + cvc];
        for (var i = 0u; i < 4u; i++) {
            let av = a4[arow[i] + l4];
            acc[i] += av.x * b0 + av.y * b1 + av.z * b2 + av.w * b3;
        }
    }
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
