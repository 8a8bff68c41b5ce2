// Column sums with subgroup operations, for adapters that have them (wgpu's SUBGROUP feature):
// a family of its own, so that adapters without subgroups still load reduce.wgsl.
//
// Entry point:
//   sum_rows_sg  cols % 4 == 0; @workgroup_size(256), dispatch (cols / 4, ceil(rows / chunk), 1):
//                out4[g * cols4 + c] = Σ_{r in chunk g} x4[r * cols4 + c], one workgroup per vec4
//                column c and chunk g. Each invocation adds every 256th row of the chunk,
//                subgroupAdd combines a subgroup's lanes, and the first invocation adds the
//                subgroups' sums (at most 64) from workgroup memory: no tree of barriers as in
//                reduce.wgsl's sum_rows_wg. Correct whatever the subgroup size or how the
//                invocations are grouped (subgroups are indexed by subgroup_id).
//
// Bindings (group 0): 0 uniform Params (as reduce.wgsl's); 1 x4, 2 out4: array<vec4<f32>>.
// Limits: 1 KiB of workgroup memory; needs subgroups (not GL).

struct Params {
    n: u32,
    rows: u32,
    cols: u32,
    chunk: u32,
    alpha: f32,
    act: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>;

var<workgroup> partial: array<vec4<f32>, 64>;

@compute @workgroup_size(256)
fn sum_rows_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) subgroups: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let cols4 = p.cols / 4u;
    let c = wg.x;
    let start = wg.y * p.chunk;
    let end = min(start + p.chunk, p.rows);
    var s = vec4<f32>(0.0);
    for (var r = start + li; r < end; r += 256u) {
        s += x4[r * cols4 + c];
    }
    let t = subgroupAdd(s);
    if (lane == 0u) {
        partial[sg] = t;
    }
    workgroupBarrier();
    if (li == 0u) {
        var total = vec4<f32>(0.0);
        for (var i = 0u; i < subgroups; i++) {
            total += partial[i];
        }
        out4[wg.y * cols4 + c] = total;
    }
}
