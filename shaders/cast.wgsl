// Casts between float32 and float16 tensors (mixed precision: a layer's input and variables
// to its float16 compute dtype, its gradients back to float32). Adapters with SHADER_F16 only.
//
// Entry points (all @workgroup_size(256)):
//   to_f16   h[2i], h[2i + 1] = f16(x[2i]), f16(x[2i + 1])      bindings x, h2
//   to_f32   x[2i], x[2i + 1] = f32(h[2i]), f32(h[2i + 1])      bindings h2, x
//            dispatch grid_1d(ceil(n / 2), 256): x = min(groups, 65535), y = ceil(groups /
//            65535); flat pair index i = gid.x + gid.y * num_workgroups.x * 256.
//   to_f16_table  many float32 tensors to float16 at once (a training step's weights under
//            mixed precision: one dispatch instead of one per weight). One workgroup per table
//            entry p.base + w (w = wid.x + wid.y * num_workgroups.x, below p.n), an entry a
//            chunk of at most 1024 elements: [len, src, dst, regions], src in 16-byte and dst
//            in 8-byte units of the regions, bit 0 of regions the source's region, bit 1 the
//            destination's. Bindings table, r0, r1, h0, h1: whole arena regions, read as float32
//            through r0, r1 and written as float16 through h0, h1 (the same two buffers again: a
//            region holds float32 sources and float16 copies alike). dispatch
//            grid_1d(entries, 1).
// Each invocation moves a pair, so that the float16 side is one 32-bit word: a lone 16-bit
// store would need its neighbour's half written by the same invocation on some drivers.
// Values beyond float16's range become ±inf, which is what loss scaling watches for; every
// entry point converts with the same vec2<f16>(vec2<f32>) (round to nearest).
//
// Bindings (group 0): 0 uniform Params; 1 x: storage array<f32>; 2 h2: storage
// array<vec2<f16>> (a float16 tensor's allocation is rounded to 256 bytes, so its last pair
// exists even for an odd n, and the table's last four halves too); 3 table: array<u32>; 4 r0,
// 5 r1: array<vec4<f32>>; 6 h0, 7 h1: array<vec4<f16>>. Params: n elements (to_f16_table:
// entries), base (to_f16_table: the first entry).

enable f16;

struct Params {
    n: u32,
    base: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> h2: array<vec2<f16>>;
@group(0) @binding(3) var<storage, read_write> table: array<u32>;
@group(0) @binding(4) var<storage, read_write> r0: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> r1: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> h0: array<vec4<f16>>;
@group(0) @binding(7) var<storage, read_write> h1: array<vec4<f16>>;

fn pair(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

@compute @workgroup_size(256)
fn to_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = pair(gid, nwg);
    let e = 2u * i;
    if (e >= p.n) { return; }
    let hi = select(0.0, x[min(e + 1u, p.n - 1u)], e + 1u < p.n);
    h2[i] = vec2<f16>(vec2<f32>(x[e], hi));
}

@compute @workgroup_size(256)
fn to_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = pair(gid, nwg);
    let e = 2u * i;
    if (e >= p.n) { return; }
    let v = vec2<f32>(h2[i]);
    x[e] = v.x;
    if (e + 1u < p.n) {
        x[e + 1u] = v.y;
    }
}

// The region bindings are uniform across a workgroup (one entry each): no divergence.
fn load4(region: u32, i: u32) -> vec4<f32> {
    if (region == 0u) { return r0[i]; }
    return r1[i];
}

@compute @workgroup_size(256)
fn to_f16_table(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    if (w >= p.n) { return; }
    let e = 4u * (p.base + w);
    let len = table[e];
    let first = 4u * li;
    if (first >= len) { return; }
    let regions = table[e + 3u];
    // Four elements: past the tensor's end (its allocation's rounding) they are zeros.
    let inside = vec4<u32>(first, first + 1u, first + 2u, first + 3u) < vec4<u32>(len);
    let v = vec4<f16>(select(vec4<f32>(0.0), load4(regions & 1u, table[e + 1u] + li), inside));
    let dst = table[e + 2u] + li;
    if ((regions & 2u) == 0u) {
        h0[dst] = v;
    } else {
        h1[dst] = v;
    }
}
