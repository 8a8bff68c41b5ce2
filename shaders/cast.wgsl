// Casts between float32 and float16 tensors (mixed precision: a layer's input and variables
// to its float16 compute dtype, its gradients back to float32). Adapters with SHADER_F16 only.
//
// Entry points (all @workgroup_size(256); dispatch grid_1d(ceil(n / 2), 256): x = min(groups,
// 65535), y = ceil(groups / 65535); flat pair index i = gid.x + gid.y * num_workgroups.x * 256):
//   to_f16   h[2i], h[2i + 1] = f16(x[2i]), f16(x[2i + 1])      bindings x, h2
//   to_f32   x[2i], x[2i + 1] = f32(h[2i]), f32(h[2i + 1])      bindings h2, x
// Each invocation moves a pair, so that the float16 side is one 32-bit word: a lone 16-bit
// store would need its neighbour's half written by the same invocation on some drivers.
// Values beyond float16's range become ±inf, which is what loss scaling watches for.
//
// Bindings (group 0): 0 uniform Params; 1 x: storage array<f32>; 2 h2: storage
// array<vec2<f16>> (a float16 tensor's allocation is rounded to 256 bytes, so its last pair
// exists even for an odd n). Params: n elements.

enable f16;

struct Params {
    n: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> h2: array<vec2<f16>>;

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
