// Depthwise 2-D convolution, depth multiplier 1, stride 1, 'same' padding (the first half of
// Keras' SeparableConv2D), NHWC activations, kernels [kh, kw, c, 1]; all channels in one launch.
//
//   forward         y[n, i, j, c] = Σ_{a, b} x[n, i + a - pt, j + b - pl, c] · k[a, b, c]
//   backward input  the same correlation of dy with the flipped kernel k[kh-1-a, kw-1-b, c]
//                   and padding (kh-1-pt, kw-1-pl) (flip = 1; dy bound as x, dx as y)
//   backward kernel dk[a, b, c] = Σ_{n, i, j} x[n, i + a - pt, j + b - pl, c] · dy[n, i, j, c],
//                   partial sums over chunks; the caller sums the [chunks, kh*kw*c] partials.
// Register blocked (loads dominate on software rasterizers): out-of-range taps read a clamped,
// valid address and are zeroed with select, so the loops have no divergent control flow.
//
// Entry points (all @workgroup_size(64); "items" are folded as grid_1d(items, 64): flat item =
// gid.x + gid.y * num_workgroups.x * 64). Channels (or vec4s of channels) vary fastest.
//   depthwise_s        any c: 4 pixels along a row × 1 channel. items = n*h*wblocks*c
//                      (wblocks = ceil(w/4)). bindings x, k, y.
//   depthwise_v4       c % 4 == 0: 4 pixels × 1 vec4 of channels; items = n*h*wblocks*c/4.
//                      bindings x4, k4, y4.
//   depthwise3x3_v4    kh = kw = 3, c % 4 == 0: 4 rows × 4 pixels × 1 vec4, reading each input
//                      row once for the block (6 loads per row, 9 kernel loads per block: 45
//                      loads for 144 vec4 multiply-adds; 2 rows gave 33 for 72);
//                      items = n*hblocks*wblocks*c/4 (hblocks = ceil(h/4)). Neighbouring lanes
//                      take neighbouring channel vec4s, so their loads share cache lines (twice
//                      as fast on lavapipe as giving each workgroup one channel vec4).
//                      bindings x4, k4, y4.
//   depthwise3x3_tile_v4  kh = kw = 3, c % 4 == 0, for GPUs: a workgroup computes an 8×8 tile of
//                      output pixels × 8 vec4s of channels; it first loads the tile's 10×10
//                      input pixels (the halo included) × 8 vec4s into workgroup memory, each
//                      input once (1.6 global loads per output vec4 instead of 2.25), then each
//                      invocation (8 channel lanes × 8 rows) computes one row of 8 pixels from
//                      workgroup memory. workgroups = n * hblocks * wblocks * cblocks (hblocks
//                      and wblocks = ceil(h/8), ceil(w/8); cblocks = ceil(c/8)), dispatched as
//                      grid_1d(workgroups * 64, 64). bindings x4, k4, y4.
//   depthwise_dk_s     any c: a unit owns 4 consecutive flattened taps t = a*kw + b (clamped) of
//                      one channel; units = ceil(kh*kw/4) * c. Item = chunk * units + unit sums
//                      over the pixels [chunk * p.chunk, .. + p.chunk) ∩ [0, total) into row
//                      `chunk` of the partials [chunks, kh*kw*c]; items = units * chunks,
//                      dispatch grid_1d(items, 64). bindings x, dy, dk.
//   depthwise_dk_v4    c % 4 == 0, the same per vec4 of channels. bindings x4, dy4, dk4.
//   depthwise3x3_dk_v4 kh = kw = 3, c % 4 == 0: a unit owns one vec4 of channels and all 9 taps
//                      and sums over image rows [chunk * p.chunk, .. + p.chunk) ∩ [0, n*h),
//                      sliding a 3×3 window along each row (4 loads per 9 products);
//                      units = c/4, items = units * chunks. bindings x4, dy4, dk4.
// Bindings (group 0): 0 uniform Params; 1 x, 2 k, 3 y, 4 dy, 5 dk: array<f32>; 6 x4, 7 k4,
// 8 y4, 9 dy4, 10 dk4: array<vec4<f32>> views. All storage is read_write (ranges of one
// buffer may meet in a dispatch). Tensors are bound to the used bindings in ascending order.
// Params: n, h, w; c = channels (in vec4s for the _v4 entry points); kh, kw; pt, pl (padding
// above / left); flip; wblocks, hblocks; items; chunk; total (pixels n*h*w, or rows n*h for
// depthwise3x3_dk_v4); units.
// Limits: three storage buffers, 12.5 KiB of workgroup memory (depthwise3x3_tile_v4), no f16 or
// subgroups (GL-compatible).

struct Params {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    kh: u32,
    kw: u32,
    pt: u32,
    pl: u32,
    flip: u32,
    wblocks: u32,
    hblocks: u32,
    items: u32,
    chunk: u32,
    total: u32,
    units: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dk: array<f32>;
@group(0) @binding(6) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> k4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> dy4: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read_write> dk4: array<vec4<f32>>;

fn item_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Image n, row i, first column j0 and channel (or vec4) ch of a 4-pixel block.
struct Block {
    n: u32,
    i: u32,
    j0: u32,
    ch: u32,
}

fn block_of(item: u32) -> Block {
    let it = min(item, p.items - 1u);
    let ch = it % p.c;
    let t = it / p.c;
    let jb = t % p.wblocks;
    let t2 = t / p.wblocks;
    return Block(t2 / p.h, t2 % p.h, jb * 4u, ch);
}

// Element offsets (in units of one channel slot: multiply by c) of the 4 pixels at tap (a, b),
// clamped to valid positions, and which are inside the image.
struct Taps {
    pix: vec4<u32>,
    valid: vec4<bool>,
}

fn taps_of(blk: Block, a: u32, b: u32) -> Taps {
    // u32 arithmetic wraps: negative positions become huge and fail the `< h` tests.
    let ii = blk.i + a - p.pt;
    let row = (blk.n * p.h + min(ii, p.h - 1u)) * p.w;
    let jj = vec4<u32>(blk.j0) + vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(b - p.pl);
    let valid = (jj < vec4<u32>(p.w)) & vec4<bool>(ii < p.h);
    return Taps(vec4<u32>(row) + min(jj, vec4<u32>(p.w - 1u)), valid);
}

fn kernel_tap(a: u32, b: u32) -> u32 {
    if (p.flip == 1u) {
        return (p.kh - 1u - a) * p.kw + (p.kw - 1u - b);
    }
    return a * p.kw + b;
}

// ---------------------------------------------------------------------------------------------

@compute @workgroup_size(64)
fn depthwise_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let blk = block_of(item);
    var acc = vec4<f32>(0.0);
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b);
            let kv = k[kernel_tap(a, b) * p.c + blk.ch];
            let at = t.pix * p.c + vec4<u32>(blk.ch);
            let xv = vec4<f32>(x[at.x], x[at.y], x[at.z], x[at.w]);
            acc += select(vec4<f32>(0.0), xv, t.valid) * kv;
        }
    }
    if (item >= p.items) { return; }
    let base = ((blk.n * p.h + blk.i) * p.w + blk.j0) * p.c + blk.ch;
    let left = p.w - blk.j0;
    y[base] = acc.x;
    if (left > 1u) { y[base + p.c] = acc.y; }
    if (left > 2u) { y[base + 2u * p.c] = acc.z; }
    if (left > 3u) { y[base + 3u * p.c] = acc.w; }
}

@compute @workgroup_size(64)
fn depthwise_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let blk = block_of(item);
    var acc: array<vec4<f32>, 4>;
    let z = vec4<f32>(0.0);
    for (var a = 0u; a < p.kh; a++) {
        for (var b = 0u; b < p.kw; b++) {
            let t = taps_of(blk, a, b);
            let kv = k4[kernel_tap(a, b) * p.c + blk.ch];
            let at = t.pix * p.c + vec4<u32>(blk.ch);
            acc[0] += select(z, x4[at.x], t.valid.x) * kv;
            acc[1] += select(z, x4[at.y], t.valid.y) * kv;
            acc[2] += select(z, x4[at.z], t.valid.z) * kv;
            acc[3] += select(z, x4[at.w], t.valid.w) * kv;
        }
    }
    if (item >= p.items) { return; }
    let base = ((blk.n * p.h + blk.i) * p.w + blk.j0) * p.c + blk.ch;
    let left = p.w - blk.j0;
    y4[base] = acc[0];
    if (left > 1u) { y4[base + p.c] = acc[1]; }
    if (left > 2u) { y4[base + 2u * p.c] = acc[2]; }
    if (left > 3u) { y4[base + 3u * p.c] = acc[3]; }
}

// ---------------------------------------------------------------------------------------------
// 3×3, vec4: 2 output rows × 4 output columns per invocation.

fn ld6(n: u32, ii: u32, j0: u32, g: u32) -> array<vec4<f32>, 6> {
    let ok = ii < p.h;
    let row = (n * p.h + min(ii, p.h - 1u)) * p.w;
    let jl = vec4<u32>(j0 - p.pl) + vec4<u32>(0u, 1u, 2u, 3u);
    let jr = vec2<u32>(j0 - p.pl) + vec2<u32>(4u, 5u);
    let vl = (jl < vec4<u32>(p.w)) & vec4<bool>(ok);
    let vr = (jr < vec2<u32>(p.w)) & vec2<bool>(ok);
    let al = (vec4<u32>(row) + min(jl, vec4<u32>(p.w - 1u))) * p.c + vec4<u32>(g);
    let ar = (vec2<u32>(row) + min(jr, vec2<u32>(p.w - 1u))) * p.c + vec2<u32>(g);
    let z = vec4<f32>(0.0);
    return array<vec4<f32>, 6>(
        select(z, x4[al.x], vl.x),
        select(z, x4[al.y], vl.y),
        select(z, x4[al.z], vl.z),
        select(z, x4[al.w], vl.w),
        select(z, x4[ar.x], vr.x),
        select(z, x4[ar.y], vr.y),
    );
}

fn row3(acc: array<vec4<f32>, 4>, xs: array<vec4<f32>, 6>, k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(
        acc[0] + xs[0] * k0 + xs[1] * k1 + xs[2] * k2,
        acc[1] + xs[1] * k0 + xs[2] * k1 + xs[3] * k2,
        acc[2] + xs[2] * k0 + xs[3] * k1 + xs[4] * k2,
        acc[3] + xs[3] * k0 + xs[4] * k1 + xs[5] * k2,
    );
}

fn store_row4(n: u32, i: u32, j0: u32, g: u32, v: array<vec4<f32>, 4>) {
    if (i >= p.h) { return; }
    let base = ((n * p.h + i) * p.w + j0) * p.c + g;
    let left = p.w - j0;
    y4[base] = v[0];
    if (left > 1u) { y4[base + p.c] = v[1]; }
    if (left > 2u) { y4[base + 2u * p.c] = v[2]; }
    if (left > 3u) { y4[base + 3u * p.c] = v[3]; }
}

@compute @workgroup_size(64)
fn depthwise3x3_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = item_index(gid, nwg);
    let it = min(item, p.items - 1u);
    let g = it % p.c;
    let t = it / p.c;
    let j0 = (t % p.wblocks) * 4u;
    let t2 = t / p.wblocks;
    let i0 = (t2 % p.hblocks) * 4u;
    let n = t2 / p.hblocks;
    // Kernel taps K(a, b), flipped for the backward pass.
    let f = p.flip == 1u;
    let k00 = k4[select(0u, 8u, f) * p.c + g];
    let k01 = k4[select(1u, 7u, f) * p.c + g];
    let k02 = k4[select(2u, 6u, f) * p.c + g];
    let k10 = k4[select(3u, 5u, f) * p.c + g];
    let k11 = k4[4u * p.c + g];
    let k12 = k4[select(5u, 3u, f) * p.c + g];
    let k20 = k4[select(6u, 2u, f) * p.c + g];
    let k21 = k4[select(7u, 1u, f) * p.c + g];
    let k22 = k4[select(8u, 0u, f) * p.c + g];
    let z = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let top = i0 - p.pt;
    // Input row top + r feeds output rows i0 + r - 2 ..= i0 + r (kernel rows 2, 1, 0).
    let r0 = ld6(n, top, j0, g);
    var o0 = row3(z, r0, k00, k01, k02);
    let r1 = ld6(n, top + 1u, j0, g);
    o0 = row3(o0, r1, k10, k11, k12);
    var o1 = row3(z, r1, k00, k01, k02);
    let r2 = ld6(n, top + 2u, j0, g);
    o0 = row3(o0, r2, k20, k21, k22);
    o1 = row3(o1, r2, k10, k11, k12);
    var o2 = row3(z, r2, k00, k01, k02);
    let r3 = ld6(n, top + 3u, j0, g);
    o1 = row3(o1, r3, k20, k21, k22);
    o2 = row3(o2, r3, k10, k11, k12);
    var o3 = row3(z, r3, k00, k01, k02);
    let r4 = ld6(n, top + 4u, j0, g);
    o2 = row3(o2, r4, k20, k21, k22);
    o3 = row3(o3, r4, k10, k11, k12);
    let r5 = ld6(n, top + 5u, j0, g);
    o3 = row3(o3, r5, k20, k21, k22);
    if (item >= p.items) { return; }
    store_row4(n, i0, j0, g, o0);
    store_row4(n, i0 + 1u, j0, g, o1);
    store_row4(n, i0 + 2u, j0, g, o2);
    store_row4(n, i0 + 3u, j0, g, o3);
}

// The input tile of depthwise3x3_tile_v4: 10 rows × 10 columns × 8 channel vec4s, channel fastest.
var<workgroup> tile: array<vec4<f32>, 800>;

@compute @workgroup_size(64)
fn depthwise3x3_tile_v4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // Which tile: channel blocks fastest, then column, row and image tiles. Workgroups past
    // the last tile (grid_1d rounds up) compute a clamped copy and store nothing.
    let cblocks = (p.c + 7u) / 8u;
    let tiles = p.n * p.hblocks * p.wblocks * cblocks;
    let flat = wg.x + wg.y * nwg.x;
    let t = min(flat, tiles - 1u);
    let cb = t % cblocks;
    let t1 = t / cblocks;
    let j0 = (t1 % p.wblocks) * 8u;
    let t2 = t1 / p.wblocks;
    let i0 = (t2 % p.hblocks) * 8u;
    let n = t2 / p.hblocks;
    let top = i32(i0) - i32(p.pt);
    let left = i32(j0) - i32(p.pl);
    // Cooperative load of the halo tile; outside the image (or past c) is zero.
    for (var e = li; e < 800u; e += 64u) {
        let cl = e % 8u;
        let col = (e / 8u) % 10u;
        let row = e / 80u;
        let ii = top + i32(row);
        let jj = left + i32(col);
        let g = cb * 8u + cl;
        let inside = ii >= 0 && ii < i32(p.h) && jj >= 0 && jj < i32(p.w) && g < p.c;
        var v = vec4<f32>(0.0);
        if (inside) {
            v = x4[((n * p.h + u32(ii)) * p.w + u32(jj)) * p.c + g];
        }
        tile[e] = v;
    }
    workgroupBarrier();
    let cl = li % 8u;
    let r = li / 8u;
    let g = min(cb * 8u + cl, p.c - 1u);
    let f = p.flip == 1u;
    var kk: array<vec4<f32>, 9>;
    for (var q = 0u; q < 9u; q++) {
        kk[q] = k4[select(q, 8u - q, f) * p.c + g];
    }
    var acc: array<vec4<f32>, 8>;
    for (var a = 0u; a < 3u; a++) {
        let base = (r + a) * 80u + cl;
        for (var b = 0u; b < 3u; b++) {
            let kv = kk[a * 3u + b];
            for (var q = 0u; q < 8u; q++) {
                acc[q] += tile[base + (q + b) * 8u] * kv;
            }
        }
    }
    let i = i0 + r;
    if (flat >= tiles || i >= p.h || cb * 8u + cl >= p.c) { return; }
    let out = ((n * p.h + i) * p.w + j0) * p.c + g;
    for (var q = 0u; q < 8u; q++) {
        if (j0 + q < p.w) {
            y4[out + q * p.c] = acc[q];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Backward kernel.

struct Walk {
    n: u32,
    i: u32,
    j: u32,
}

fn walk_start(start: u32) -> Walk {
    let t = start / p.w;
    return Walk(t / p.h, t % p.h, start % p.w);
}

fn walk_next(s: Walk) -> Walk {
    var r = s;
    r.j += 1u;
    if (r.j == p.w) {
        r.j = 0u;
        r.i += 1u;
        if (r.i == p.h) {
            r.i = 0u;
            r.n += 1u;
        }
    }
    return r;
}

// Shifts (a - pt, b - pl) of the 4 taps t0.. (clamped to the last tap), wrapping.
struct TapShift {
    da: vec4<u32>,
    db: vec4<u32>,
    off: vec4<u32>,
}

fn tap_shift(t0: u32) -> TapShift {
    let t = min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.kh * p.kw - 1u));
    let da = t / p.kw - vec4<u32>(p.pt);
    let db = t % p.kw - vec4<u32>(p.pl);
    return TapShift(da, db, da * p.w + db);
}

// Pixel offsets (clamped) of the 4 taps for output pixel s, and their validity.
fn shifted(s: Walk, ts: TapShift) -> Taps {
    let ii = vec4<u32>(s.i) + ts.da;
    let jj = vec4<u32>(s.j) + ts.db;
    let valid = (ii < vec4<u32>(p.h)) & (jj < vec4<u32>(p.w));
    let last = p.n * p.h * p.w - 1u;
    let pix = min(vec4<u32>((s.n * p.h + s.i) * p.w + s.j) + ts.off, vec4<u32>(last));
    return Taps(pix, valid);
}

// A dk invocation: which unit and which chunk.
struct DkItem {
    live: bool,
    unit: u32,
    chunk: u32,
}

fn dk_item(gid: vec3<u32>, nwg: vec3<u32>) -> DkItem {
    let item = item_index(gid, nwg);
    let it = min(item, p.items - 1u);
    return DkItem(item < p.items, it % p.units, it / p.units);
}

@compute @workgroup_size(64)
fn depthwise_dk_s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let di = dk_item(gid, nwg);
    let ch = di.unit % p.c;
    let t0 = (di.unit / p.c) * 4u;
    let ts = tap_shift(t0);
    let start = di.chunk * p.chunk;
    var acc = vec4<f32>(0.0);
    var s = walk_start(start);
    // A uniform trip count; pixels past the end (last chunk) contribute zero.
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let t = shifted(s, ts);
        let at = t.pix * p.c + vec4<u32>(ch);
        let valid = t.valid & vec4<bool>(pix < p.total);
        let xv = select(vec4<f32>(0.0), vec4<f32>(x[at.x], x[at.y], x[at.z], x[at.w]), valid);
        acc += xv * dy[min(pix, p.total - 1u) * p.c + ch];
        s = walk_next(s);
    }
    if (!di.live) { return; }
    let taps = p.kh * p.kw;
    let row = di.chunk * taps * p.c;
    dk[row + t0 * p.c + ch] = acc.x;
    if (t0 + 1u < taps) { dk[row + (t0 + 1u) * p.c + ch] = acc.y; }
    if (t0 + 2u < taps) { dk[row + (t0 + 2u) * p.c + ch] = acc.z; }
    if (t0 + 3u < taps) { dk[row + (t0 + 3u) * p.c + ch] = acc.w; }
}

@compute @workgroup_size(64)
fn depthwise_dk_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let di = dk_item(gid, nwg);
    let g = di.unit % p.c;
    let t0 = (di.unit / p.c) * 4u;
    let ts = tap_shift(t0);
    let start = di.chunk * p.chunk;
    var acc: array<vec4<f32>, 4>;
    let z = vec4<f32>(0.0);
    var s = walk_start(start);
    for (var q = 0u; q < p.chunk; q++) {
        let pix = start + q;
        let t = shifted(s, ts);
        let at = t.pix * p.c + vec4<u32>(g);
        let d = select(z, dy4[min(pix, p.total - 1u) * p.c + g], pix < p.total);
        acc[0] += select(z, x4[at.x], t.valid.x) * d;
        acc[1] += select(z, x4[at.y], t.valid.y) * d;
        acc[2] += select(z, x4[at.z], t.valid.z) * d;
        acc[3] += select(z, x4[at.w], t.valid.w) * d;
        s = walk_next(s);
    }
    if (!di.live) { return; }
    let taps = p.kh * p.kw;
    let row = di.chunk * taps * p.c;
    dk4[row + t0 * p.c + g] = acc[0];
    if (t0 + 1u < taps) { dk4[row + (t0 + 1u) * p.c + g] = acc[1]; }
    if (t0 + 2u < taps) { dk4[row + (t0 + 2u) * p.c + g] = acc[2]; }
    if (t0 + 3u < taps) { dk4[row + (t0 + 3u) * p.c + g] = acc[3]; }
}

// One input column (rows r0, r0+1, r0+2 of the window) at column jj, zero outside the image.
fn col3(n: u32, ii: vec3<u32>, jj: u32, g: u32) -> array<vec4<f32>, 3> {
    let ok = (ii < vec3<u32>(p.h)) & vec3<bool>(jj < p.w);
    let at = ((vec3<u32>(n * p.h) + min(ii, vec3<u32>(p.h - 1u))) * p.w + min(jj, p.w - 1u)) * p.c + vec3<u32>(g);
    let z = vec4<f32>(0.0);
    return array<vec4<f32>, 3>(select(z, x4[at.x], ok.x), select(z, x4[at.y], ok.y), select(z, x4[at.z], ok.z));
}

@compute @workgroup_size(64)
fn depthwise3x3_dk_v4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let di = dk_item(gid, nwg);
    let g = di.unit;
    let start = di.chunk * p.chunk;
    let z = vec4<f32>(0.0);
    // acc[a * 3 + b]: tap (a, b).
    var acc: array<vec4<f32>, 9>;
    for (var q = 0u; q < p.chunk; q++) {
        // Rows past the end (last chunk) read the last row with dy taken as zero.
        let live = start + q < p.total;
        let rr = min(start + q, p.total - 1u);
        let n = rr / p.h;
        let i = rr % p.h;
        let ii = vec3<u32>(i - p.pt) + vec3<u32>(0u, 1u, 2u);
        // Window columns j - pl, j + 1 - pl, j + 2 - pl.
        var c0 = col3(n, ii, 0u - p.pl, g);
        var c1 = col3(n, ii, 1u - p.pl, g);
        let drow = rr * p.w;
        for (var j = 0u; j < p.w; j++) {
            let c2 = col3(n, ii, j + 2u - p.pl, g);
            let d = select(z, dy4[(drow + j) * p.c + g], live);
            acc[0] += c0[0] * d;
            acc[1] += c1[0] * d;
            acc[2] += c2[0] * d;
            acc[3] += c0[1] * d;
            acc[4] += c1[1] * d;
            acc[5] += c2[1] * d;
            acc[6] += c0[2] * d;
            acc[7] += c1[2] * d;
            acc[8] += c2[2] * d;
            c0 = c1;
            c1 = c2;
        }
    }
    if (!di.live) { return; }
    let row = di.chunk * 9u * p.c + g;
    dk4[row] = acc[0];
    dk4[row + p.c] = acc[1];
    dk4[row + 2u * p.c] = acc[2];
    dk4[row + 3u * p.c] = acc[3];
    dk4[row + 4u * p.c] = acc[4];
    dk4[row + 5u * p.c] = acc[5];
    dk4[row + 6u * p.c] = acc[6];
    dk4[row + 7u * p.c] = acc[7];
    dk4[row + 8u * p.c] = acc[8];
}
