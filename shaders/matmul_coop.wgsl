// Matrix product on cooperative matrices (tensor cores), float16 in, float32 accumulation:
//   out[m, n] = f16(act(op(A) · op(B) + bias))
// where op(A) is A [m, k] or, transposed, a stored [k, m] (likewise B), read through the strides
// of matmul.wgsl's Params: A(i, l) = a[i * a_rs + l * a_cs], B(l, j) = b[l * b_rs + j * b_cs].
// Every product matmul.wgsl computes (dense forward and both gradients, 1×1 convolutions run as
// products), for float16 tensors only: this family is written in float16 and never goes through
// the float16 twin generator (ShaderFamily::has_half_twin is false for it). Convolutions too, as
// implicit products: with p.conv set, the loads of A gather the im2col matrix of an image
// (see load_a_gathered) instead of reading a stored A, so a k×k convolution (any strides, dilation and
// padding) runs on the same kernels as a product without an im2col buffer: the forward pass and
// the input gradient (dz, seen upsampled by the strides, correlated with the flipped kernel) on
// every entry point but the split one (the vec4 ones where the input and output channels are
// multiples of 4), the kernel gradient on the split one.
//
// Entry points (@workgroup_size(128): four subgroups of 32 invocations, which the host checks:
// the adapter's subgroup size is exactly 32, as on NVIDIA; each subgroup owns the fragments its
// subgroup_id names, so another size would leave fragments unwritten):
//   matmul_coop_64x64  a 64×64 output tile per workgroup, each subgroup 32×32 (2×2 fragments);
//                      dispatch (ceil(n / 64), ceil(m / 64), 1), rows folded as row_tile().
//   matmul_coop_32x64  a 32×64 output tile, each subgroup 16×32 (1×2 fragments), for products
//                      with few 64×64 tiles; dispatch (ceil(n / 64), ceil(m / 32), 1).
//   matmul_coop_64x64_v4, matmul_coop_32x64_v4  the same with A stored [m, k] and B [k, n]
//                      (no transposes), k and n multiples of 4: A and B read one vec4 at a time
//                      through a4 and b4 (bindings 3 bias, 4 out, 5 a4, 6 b4).
//   matmul_coop_64x64_splitk  matmul_coop_64x64 over one slice of k per workgroup layer: slice
//                      z covers k in [z * k_slice, (z + 1) * k_slice) (k_slice a multiple of
//                      32), and its raw float32 sums (no bias, no activation, no rounding) go to
//                      part at z * m * n; the caller adds the layers up (matmul.wgsl's
//                      splitk_reduce with the bias and activation, or a column sum). For
//                      products with few output tiles and a long k (a dense layer's kernel
//                      gradient, a 1×1 convolution's: k = the pixels); dispatch (ceil(n / 64),
//                      ceil(m / 64), splits), bindings 1 a, 2 b, 7 part.
//   matmul_coop_64x32_v4  a 64×32 output tile (A and B as the _v4 kernels), each subgroup
//                      32×16 (2×1 fragments), for products 32 columns wide or narrower (the 1×1
//                      convolutions to 32 channels), where a 64-column tile multiplies zeros;
//                      dispatch (ceil(n / 32), ceil(m / 64), 1).
// Both step through k 32 at a time: the workgroup copies A's 64 (or 32) × 32 and B's 32 × 64
// slices into workgroup memory, zero past the matrix's edges (any m, n, k, no alignment), so
// the 16×16×16 fragments the tensor cores multiply only ever read workgroup memory. Each
// subgroup's float32 accumulators go through workgroup memory once at the end, one fragment
// per round, where the whole workgroup adds the bias, applies act, rounds to float16 and stores
// the elements inside the output.
//
// Needs: f16 (SHADER_F16), subgroups (subgroup_id), cooperative matrices with a 16×16×16
// configuration of float16 A/B and float32 C (wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX and the
// adapter's CooperativeMatrixProperties). wgpu's WGSL: coopLoadT / coopStoreT are row-major
// (element (r, c) at p[r * stride + c]), coopLoad / coopStore column-major; strides here are
// multiples of 16 bytes and fragments start at 16-byte offsets.
//
// Bindings (group 0): 0 uniform Params (matmul.wgsl's); 1 a, 2 b, 3 bias ([n], read only when
// has_bias), 4 out: storage read_write array<f16>, row-major; 5 a4, 6 b4: a and b as
// array<vec4<f16>>; 7 part: the split kernel's float32 partial sums [splits, m, n].
// Params: m, k, n, has_bias, the strides, act (0 linear, 1 relu, 2 selu), k_slice (the split
// kernel's); block and chunk unused (matmul.wgsl's); then the convolution A is the im2col
// matrix of (conv 1 or 2, see load_a_gathered; 0: A is a itself).
// Limits: 128 invocations, 13,824 bytes of workgroup memory, four storage buffers an entry.

enable f16;
enable wgpu_cooperative_matrix;

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
    // The convolution whose im2col matrix A is, `conv` 1 or 2 (see load_a_gathered); unused at 0.
    conv: u32,
    h: u32,
    w: u32,
    ci: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    dh: u32,
    dw: u32,
    pt: u32,
    pl: u32,
    uh: u32,
    uw: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f16>;
@group(0) @binding(2) var<storage, read_write> b: array<f16>;
@group(0) @binding(3) var<storage, read_write> bias: array<f16>;
@group(0) @binding(4) var<storage, read_write> out: array<f16>;
// a and b as vec4 (the _v4 entry points; ranges are 256-byte aligned and sized).
@group(0) @binding(5) var<storage, read_write> a4: array<vec4<f16>>;
@group(0) @binding(6) var<storage, read_write> b4: array<vec4<f16>>;
// matmul_coop_64x64_splitk's raw partial products.
@group(0) @binding(7) var<storage, read_write> part: array<f32>;

// Steps of k per pass through workgroup memory (two fragments deep).
const BK: u32 = 32u;
// Row strides of the tiles in workgroup memory: a row plus 8 halves (16 bytes), so rows start
// 16-byte aligned and consecutive rows fall on other banks.
const AS: u32 = 40u;
const BS: u32 = 72u;

// A's slice: up to 64 rows × BK; B's: BK rows × 64 columns.
var<workgroup> at: array<f16, 2560>;
var<workgroup> bt: array<f16, 2304>;
// One 16×16 float32 fragment per subgroup, on its way out.
var<workgroup> ct: array<f32, 1024>;

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

// As matmul.wgsl's: more than 65,535 row tiles are dispatched as (x, 65,535, z).
fn row_tile(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

// A(i, l), zero outside [0, m) × [0, k) (the clamped index keeps the load inside the buffer).
fn a_at(i: u32, l: u32) -> f16 {
    let v = a[min(i, p.m - 1u) * p.a_rs + min(l, p.k - 1u) * p.a_cs];
    return select(0.0h, v, i < p.m && l < p.k);
}

// B(l, j), zero outside [0, k) × [0, n).
fn b_at(l: u32, j: u32) -> f16 {
    let v = b[min(l, p.k - 1u) * p.b_rs + min(j, p.n - 1u) * p.b_cs];
    return select(0.0h, v, l < p.k && j < p.n);
}

// The im2col matrix of a convolution of x [batch, h, w, ci] (bound as a) to oh × ow output
// pixels: element (pixel, tap), output pixel (img, oi, oj) and tap (ki, kj, c) (tap = (ki * kw +
// kj) * ci + c), reads x[img, oi * sh + ki * dh - pt, oj * sw + kj * dw - pl, c], zero in the
// padding and outside the matrix. With uh, uw above 1, x is seen upsampled by them (uh - 1 rows
// of zeros between its rows, likewise columns): the input gradient of a strided convolution.
// A is that matrix [pixels, taps] when p.conv is 1 (m pixels, k taps: the forward product with
// the kernel [taps, co]) and its transpose [taps, pixels] when 2 (m taps, k pixels: the kernel
// gradient's, with dz [pixels, co]). The loads split an element into its pixel's part and its
// tap's, each computed once where an invocation keeps it across a tile (the divisions are most
// of a gather's work).

// An output pixel's image and first input row and column; `inside`: a pixel of the matrix.
struct Pixel {
    img: u32,
    y: i32,
    x: i32,
    inside: bool,
}

fn pixel_of(pixel: u32, pixels: u32) -> Pixel {
    let px = min(pixel, pixels - 1u);
    let img = px / (p.oh * p.ow);
    let rest = px - img * p.oh * p.ow;
    let oi = rest / p.ow;
    let oj = rest - oi * p.ow;
    return Pixel(img, i32(oi * p.sh), i32(oj * p.sw), pixel < pixels);
}

// A tap's row and column offsets (padding included) and channel; `inside`: a tap of the matrix.
struct Tap {
    dy: i32,
    dx: i32,
    c: u32,
    inside: bool,
}

fn tap_of(tap: u32, taps: u32) -> Tap {
    let tp = min(tap, taps - 1u);
    let kk = tp / p.ci;
    let ki = kk / p.kw;
    let dy = i32(ki * p.dh) - i32(p.pt);
    let dx = i32((kk - ki * p.kw) * p.dw) - i32(p.pl);
    return Tap(dy, dx, tp - kk * p.ci, tap < taps);
}

// Where element (pixel, tap) lies in x, and whether it is there at all (outside, the index is
// a clamped one inside x).
struct Gathered {
    index: u32,
    inside: bool,
}

fn locate(px: Pixel, tp: Tap) -> Gathered {
    var ih = px.y + tp.dy;
    var iw = px.x + tp.dx;
    var on_grid = true;
    if (p.uh * p.uw > 1u) {
        // (A negative row that divides gives a negative quotient, outside all the same.)
        on_grid = ih % i32(p.uh) == 0 && iw % i32(p.uw) == 0;
        ih /= i32(p.uh);
        iw /= i32(p.uw);
    }
    let inside = on_grid && px.inside && tp.inside && ih >= 0 && ih < i32(p.h) && iw >= 0
        && iw < i32(p.w);
    let row = px.img * p.h + u32(clamp(ih, 0, i32(p.h) - 1));
    return Gathered((row * p.w + u32(clamp(iw, 0, i32(p.w) - 1))) * p.ci + tp.c, inside);
}

fn gather(px: Pixel, tp: Tap) -> f16 {
    let g = locate(px, tp);
    return select(0.0h, a[g.index], g.inside);
}

// load_a for a gathered A (p.conv 1 or 2). An invocation keeps one column of the tile (p.conv 1,
// along the taps) or one row (p.conv 2: rows is 64 or 32, which divide 128) in every round, so
// that tap is split once.
fn load_a_gathered(rows: u32, row0: u32, k0: u32, t: u32) {
    if (p.conv == 1u) {
        let c = t % BK;
        let tp = tap_of(k0 + c, p.k);
        for (var e = t; e < rows * BK; e += 128u) {
            let r = e / BK;
            at[r * AS + c] = gather(pixel_of(row0 + r, p.m), tp);
        }
    } else {
        let r = t % rows;
        let tp = tap_of(row0 + r, p.m);
        for (var e = t; e < rows * BK; e += 128u) {
            let c = e / rows;
            at[r * AS + c] = gather(pixel_of(k0 + c, p.k), tp);
        }
    }
}

// Copies A's rows [row0, row0 + rows) × k [k0, k0 + BK) into `at` (row-major, stride AS);
// rows * BK is a multiple of 128. Neighbouring invocations take neighbouring addresses of A:
// along k when A is stored [m, k], along m when stored transposed.
fn load_a(rows: u32, row0: u32, k0: u32, t: u32) {
    if (p.conv != 0u) {
        load_a_gathered(rows, row0, k0, t);
        return;
    }
    let along_k = p.a_cs == 1u;
    for (var e = t; e < rows * BK; e += 128u) {
        var r = e / BK;
        var c = e % BK;
        if (!along_k) {
            r = e % rows;
            c = e / rows;
        }
        at[r * AS + c] = a_at(row0 + r, k0 + c);
    }
}

// Copies B's k [k0, k0 + BK) × columns [col0, col0 + 64) into `bt` (row-major, stride BS),
// along n when B is stored [k, n], along k when stored transposed.
fn load_b(col0: u32, k0: u32, t: u32) {
    let along_n = p.b_cs == 1u;
    for (var e = t; e < BK * 64u; e += 128u) {
        var r = e / 64u;
        var c = e % 64u;
        if (!along_n) {
            r = e % BK;
            c = e / BK;
        }
        bt[r * BS + c] = b_at(k0 + r, col0 + c);
    }
}

// load_a with A stored [m, k] (or the im2col matrix, p.conv 1, ci a multiple of 4), k a
// multiple of 4: one vec4 of A per load (BK / 4 of a row).
fn load_a4(rows: u32, row0: u32, k0: u32, t: u32) {
    let k4 = p.k / 4u;
    // A gathered A's tap (four channels of one: ci is a multiple of 4), the same in every round
    // (BK / 4 divides 128). A clamped index stays in the same vec4.
    var tp: Tap;
    if (p.conv == 1u) {
        tp = tap_of(k0 + 4u * (t % (BK / 4u)), p.k);
    }
    for (var e = t; e < rows * BK / 4u; e += 128u) {
        let r = e / (BK / 4u);
        let c4 = e % (BK / 4u);
        let i = row0 + r;
        let l4 = k0 / 4u + c4;
        var w: vec4<f16>;
        if (p.conv == 1u) {
            let g = locate(pixel_of(i, p.m), tp);
            w = select(vec4<f16>(0.0h), a4[g.index / 4u], g.inside);
        } else {
            let v = a4[min(i, p.m - 1u) * k4 + min(l4, k4 - 1u)];
            w = select(vec4<f16>(0.0h), v, i < p.m && l4 < k4);
        }
        let o = r * AS + 4u * c4;
        at[o] = w.x;
        at[o + 1u] = w.y;
        at[o + 2u] = w.z;
        at[o + 3u] = w.w;
    }
}

// load_b with B stored [k, n], n a multiple of 4, over `cols` (64 or 32) columns: one vec4 of B
// per load.
fn load_b4(col0: u32, k0: u32, t: u32, cols: u32) {
    let n4 = p.n / 4u;
    let row4 = cols / 4u;
    for (var e = t; e < BK * row4; e += 128u) {
        let r = e / row4;
        let c4 = e % row4;
        let l = k0 + r;
        let j4 = col0 / 4u + c4;
        let v = b4[min(l, p.k - 1u) * n4 + min(j4, n4 - 1u)];
        let w = select(vec4<f16>(0.0h), v, l < p.k && j4 < n4);
        let o = r * BS + 4u * c4;
        bt[o] = w.x;
        bt[o + 1u] = w.y;
        bt[o + 2u] = w.z;
        bt[o + 3u] = w.w;
    }
}

// Writes out the fragments the subgroups stored in `ct` this round: element (r, c) of
// subgroup s's fragment goes to row row0 + (s / 2) * sub_rows + fr + r, column col0 + (s % 2) *
// sub_cols + fc + c, where (fr, fc) is the fragment's offset within the subgroup's block.
// Elements outside [0, m) × [0, n) are dropped.
fn write_round(t: u32, row0: u32, col0: u32, sub_rows: u32, sub_cols: u32, fr: u32, fc: u32) {
    for (var e = t; e < 1024u; e += 128u) {
        let s = e / 256u;
        let idx = e % 256u;
        let i = row0 + (s / 2u) * sub_rows + fr + idx / 16u;
        let j = col0 + (s % 2u) * sub_cols + fc + idx % 16u;
        if (i < p.m && j < p.n) {
            var v = ct[e];
            if (p.has_bias == 1u) {
                v += f32(bias[j]);
            }
            out[i * p.n + j] = f16(act(v, p.act));
        }
    }
}

@compute @workgroup_size(128)
fn matmul_coop_64x64(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = row_tile(wg, nwg) * 64u;
    let col0 = wg.x * 64u;
    // Subgroup sg's 32×32 block of the tile: rows ar, ar + 16; columns bc, bc + 16.
    let ar = (sg / 2u) * 32u;
    let bc = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // The previous step's fragments are loaded before the tiles are overwritten.
        workgroupBarrier();
        load_a(64u, row0, k0, t);
        load_b(col0, k0, t);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&at[(ar + 16u) * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc + 16u], BS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
    }
    let slot = sg * 256u;
    coopStoreT(c00, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 0u, 0u);
    workgroupBarrier();
    coopStoreT(c01, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 0u, 16u);
    workgroupBarrier();
    coopStoreT(c10, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 16u, 0u);
    workgroupBarrier();
    coopStoreT(c11, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 16u, 16u);
}

// write_round for matmul_coop_64x64_splitk: the raw sums of a 64×64 tile's fragments this
// round into layer `layer` of part.
fn write_part(t: u32, row0: u32, col0: u32, fr: u32, fc: u32, layer: u32) {
    for (var e = t; e < 1024u; e += 128u) {
        let s = e / 256u;
        let idx = e % 256u;
        let i = row0 + (s / 2u) * 32u + fr + idx / 16u;
        let j = col0 + (s % 2u) * 32u + fc + idx % 16u;
        if (i < p.m && j < p.n) {
            part[layer + i * p.n + j] = ct[e];
        }
    }
}

@compute @workgroup_size(128)
fn matmul_coop_64x64_splitk(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    // Subgroup sg's 32×32 block of the tile: rows ar, ar + 16; columns bc, bc + 16.
    let ar = (sg / 2u) * 32u;
    let bc = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    let k_end = min((wg.z + 1u) * p.k_slice, p.k);
    for (var k0 = wg.z * p.k_slice; k0 < k_end; k0 += BK) {
        // The previous step's fragments are loaded before the tiles are overwritten.
        workgroupBarrier();
        load_a(64u, row0, k0, t);
        load_b(col0, k0, t);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&at[(ar + 16u) * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc + 16u], BS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
    }
    let layer = wg.z * p.m * p.n;
    let slot = sg * 256u;
    coopStoreT(c00, &ct[slot], 16u);
    workgroupBarrier();
    write_part(t, row0, col0, 0u, 0u, layer);
    workgroupBarrier();
    coopStoreT(c01, &ct[slot], 16u);
    workgroupBarrier();
    write_part(t, row0, col0, 0u, 16u, layer);
    workgroupBarrier();
    coopStoreT(c10, &ct[slot], 16u);
    workgroupBarrier();
    write_part(t, row0, col0, 16u, 0u, layer);
    workgroupBarrier();
    coopStoreT(c11, &ct[slot], 16u);
    workgroupBarrier();
    write_part(t, row0, col0, 16u, 16u, layer);
}

@compute @workgroup_size(128)
fn matmul_coop_32x64(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = row_tile(wg, nwg) * 32u;
    let col0 = wg.x * 64u;
    // Subgroup sg's 16×32 block of the tile: rows ar; columns bc, bc + 16.
    let ar = (sg / 2u) * 16u;
    let bc = (sg % 2u) * 32u;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        workgroupBarrier();
        load_a(32u, row0, k0, t);
        load_b(col0, k0, t);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc + 16u], BS);
            c0 = coopMultiplyAdd(a0, b0, c0);
            c1 = coopMultiplyAdd(a0, b1, c1);
        }
    }
    let slot = sg * 256u;
    coopStoreT(c0, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 16u, 32u, 0u, 0u);
    workgroupBarrier();
    coopStoreT(c1, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 16u, 32u, 0u, 16u);
}

@compute @workgroup_size(128)
fn matmul_coop_64x64_v4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = row_tile(wg, nwg) * 64u;
    let col0 = wg.x * 64u;
    // Subgroup sg's 32×32 block of the tile: rows ar, ar + 16; columns bc, bc + 16.
    let ar = (sg / 2u) * 32u;
    let bc = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // The previous step's fragments are loaded before the tiles are overwritten.
        workgroupBarrier();
        load_a4(64u, row0, k0, t);
        load_b4(col0, k0, t, 64u);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&at[(ar + 16u) * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc + 16u], BS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
    }
    let slot = sg * 256u;
    coopStoreT(c00, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 0u, 0u);
    workgroupBarrier();
    coopStoreT(c01, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 0u, 16u);
    workgroupBarrier();
    coopStoreT(c10, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 16u, 0u);
    workgroupBarrier();
    coopStoreT(c11, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 32u, 16u, 16u);
}

@compute @workgroup_size(128)
fn matmul_coop_32x64_v4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = row_tile(wg, nwg) * 32u;
    let col0 = wg.x * 64u;
    // Subgroup sg's 16×32 block of the tile: rows ar; columns bc, bc + 16.
    let ar = (sg / 2u) * 16u;
    let bc = (sg % 2u) * 32u;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        workgroupBarrier();
        load_a4(32u, row0, k0, t);
        load_b4(col0, k0, t, 64u);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc + 16u], BS);
            c0 = coopMultiplyAdd(a0, b0, c0);
            c1 = coopMultiplyAdd(a0, b1, c1);
        }
    }
    let slot = sg * 256u;
    coopStoreT(c0, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 16u, 32u, 0u, 0u);
    workgroupBarrier();
    coopStoreT(c1, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 16u, 32u, 0u, 16u);
}

@compute @workgroup_size(128)
fn matmul_coop_64x32_v4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let row0 = row_tile(wg, nwg) * 64u;
    let col0 = wg.x * 32u;
    // Subgroup sg's 32×16 block of the tile: rows ar, ar + 16; columns bc.
    let ar = (sg / 2u) * 32u;
    let bc = (sg % 2u) * 16u;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        workgroupBarrier();
        load_a4(64u, row0, k0, t);
        load_b4(col0, k0, t, 32u);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&at[ar * AS + kk], AS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&at[(ar + 16u) * AS + kk], AS);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&bt[kk * BS + bc], BS);
            c0 = coopMultiplyAdd(a0, b0, c0);
            c1 = coopMultiplyAdd(a1, b0, c1);
        }
    }
    let slot = sg * 256u;
    coopStoreT(c0, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 16u, 0u, 0u);
    workgroupBarrier();
    coopStoreT(c1, &ct[slot], 16u);
    workgroupBarrier();
    write_round(t, row0, col0, 32u, 16u, 16u, 0u);
}
