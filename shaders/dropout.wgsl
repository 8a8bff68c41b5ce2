// Inverted dropout (Keras' Dropout in training) with a counter-based mask: element i is kept
// when (hash(i, key) >> 8) >= threshold, i.e. with probability 1 - threshold / 2^24, and kept
// values are scaled by 1 / (1 - rate). key mixes the layer's seed and step counter (computed on
// the host by the same function, `mix` below); the hash uses only u32 arithmetic, so CPU:0
// (src/ops/cpu/dropout.rs) and every GPU draw the same mask for the same key.
//
//   hash(i, key) = mix(mix(i ^ key) + key), mix = Wellons' lowbias32.
//
// The forward pass also writes the mask as the multiplier it applied (scale or 0), which the
// backward pass applies to the gradient (dx = mask * dy), as TensorFlow keeps its keep-mask.
//
// Entry points (dispatch grid_1d(items, 64); flat item = gid.x + gid.y * num_workgroups.x * 64):
//   dropout       m = keep(i) ? scale : 0; y = x * m. bindings x, y, mask.
//   dropout_grad  y = x * mask (x being dy, y dx). bindings x, y, mask.
// Bindings (group 0): 0 uniform Params; 1 x, 2 y, 3 mask: array<f32> (float16 in the twin).
// All storage read_write.
// Params: items, key, threshold (ceil(rate * 2^24)), scale (1 / (1 - rate) in f32).
// Limits: three storage buffers, no workgroup memory (GL-compatible).

struct Params {
    items: u32,
    key: u32,
    threshold: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> mask: array<f32>;

fn mix(h: u32) -> u32 {
    var v = h;
    v = v ^ (v >> 16u);
    v = v * 0x7feb352du;
    v = v ^ (v >> 15u);
    v = v * 0x846ca68bu;
    v = v ^ (v >> 16u);
    return v;
}

@compute @workgroup_size(64)
fn dropout(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.items) { return; }
    let bits = mix(mix(i ^ p.key) + p.key) >> 8u;
    let m = select(0.0, p.scale, bits >= p.threshold);
    mask[i] = m;
    y[i] = x[i] * m;
}

@compute @workgroup_size(64)
fn dropout_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.items) { return; }
    y[i] = x[i] * mask[i];
}
