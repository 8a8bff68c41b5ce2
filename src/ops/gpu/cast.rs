//! Many float32 tensors cast to float16 in one dispatch: `to_f16_table` in `shaders/cast.wgsl`.
//!
//! Under mixed precision a training step reads each weight in float16 (Keras' autocast
//! variables); one `to_f16` dispatch per weight was 21 dispatches a step for the tutorial CNN,
//! each as long on a GPU as a kernel over thousands of elements. The table names each chunk of
//! 1024 elements with its source and destination in the arena's regions, as the fused update's
//! does; a step whose tensors span more than two regions (memory growth) takes a dispatch per
//! group of two.

use crate::device::logical::GpuRange;
use crate::error::Result;
use crate::ops::gpu::kernels::{u, CastParams, GpuKernels};
use crate::ops::gpu::regions::{join, regions_of, Group};
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::tensor::{DType, Tensor};

pub(crate) const TO_F16_TABLE: Kernel = Kernel::new(ShaderFamily::Cast, "to_f16_table");

/// Elements one workgroup of `to_f16_table` casts (256 invocations, 4 each).
const CHUNK: usize = 1024;
/// Region bindings of `to_f16_table` (r0, r1).
const REGIONS: usize = 2;

/// The table words (`[len, src, dst, regions]` per chunk of [`CHUNK`]) for casting each `(source,
/// destination)` and its dispatch groups. Pairs are taken in the order of the regions they use,
/// so that pairs sharing regions share a dispatch.
fn plan<'a>(pairs: &[(GpuRange<'a>, GpuRange<'a>, usize)]) -> Option<(Vec<u32>, Vec<Group<'a>>)> {
    let mut placed: Vec<_> = pairs
        .iter()
        .map(|&(src, dst, len)| {
            let (mine, key) = regions_of([src.buffer, dst.buffer]);
            (key, src, dst, len, mine)
        })
        .collect();
    // Stable: pairs in the same regions keep their order.
    placed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut words = Vec::new();
    let mut groups: Vec<Group<'a>> = Vec::new();
    for (_, src, dst, len, mine) in placed {
        let group = join(&mut groups, &mine, REGIONS);
        let bits = group.index_of(src.buffer)? | (group.index_of(dst.buffer)? << 1);
        // Offsets in vec4s (16 bytes of float32, 8 of float16): allocations are aligned to
        // 256 bytes.
        let (src_at, dst_at) = (u((src.offset / 16) as usize), u((dst.offset / 8) as usize));
        for start in (0..len).step_by(CHUNK) {
            words.extend_from_slice(&[
                u(CHUNK.min(len - start)),
                src_at + u(start / 4),
                dst_at + u(start / 4),
                bits,
            ]);
            group.entries += 1;
        }
    }
    Some((words, groups))
}

impl GpuKernels<'_> {
    /// Each float32 `xs[i]` into the float16 `outs[i]` by `to_f16_table`; `false` (nothing
    /// recorded) when the pairs are not all float32 to float16 on this GPU.
    pub(crate) fn cast_to_f16_at_once(&self, xs: &[Tensor], outs: &[Tensor]) -> Result<bool> {
        let mut pairs = Vec::with_capacity(xs.len());
        for (x, out) in xs.iter().zip(outs) {
            if x.dtype() != DType::F32 || out.dtype() != DType::F16 || x.len() != out.len() {
                return Ok(false);
            }
            if x.is_empty() {
                continue;
            }
            match (x.gpu_range(), out.gpu_range()) {
                (Some(src), Some(dst)) => pairs.push((src, dst, x.len())),
                _ => return Ok(false),
            }
        }
        let Some((words, groups)) = plan(&pairs) else {
            return Ok(false);
        };
        if words.is_empty() {
            return Ok(true);
        }
        self.dev.ctx.with_table(&words, |table| {
            let mut base = 0;
            for g in &groups {
                let (Some(r0), Some(r1)) = (g.region(0), g.region(1)) else {
                    continue;
                };
                let p = CastParams {
                    n: u(g.entries),
                    base: u(base),
                };
                base += g.entries;
                // The regions twice: read as float32, written as float16.
                let ranges = [table, r0, r1, r0, r1];
                self.launch_ranges(TO_F16_TABLE, &p, &ranges, grid_1d(g.entries, 1))?;
            }
            Ok(())
        })?;
        Ok(true)
    }
}
