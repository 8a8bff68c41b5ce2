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
use crate::ops::gpu::{grid_1d, Kernel, ShaderFamily};
use crate::tensor::{DType, Tensor};

pub(crate) const TO_F16_TABLE: Kernel = Kernel::new(ShaderFamily::Cast, "to_f16_table");

/// Elements one workgroup of `to_f16_table` casts (256 invocations, 4 each).
const CHUNK: usize = 1024;
/// Region bindings of `to_f16_table` (r0, r1).
const REGIONS: usize = 2;

/// Consecutive table entries whose tensors lie in at most [`REGIONS`] regions: one dispatch.
struct Group<'a> {
    regions: Vec<&'a wgpu::Buffer>,
    entries: usize,
}

/// The table words (`[len, src, dst, regions]` per chunk of [`CHUNK`]) for casting each `(source,
/// destination)` and its dispatch groups. Pairs are taken in the order of the regions they use,
/// so that pairs sharing regions share a dispatch.
fn plan<'a>(pairs: &[(GpuRange<'a>, GpuRange<'a>, usize)]) -> (Vec<u32>, Vec<Group<'a>>) {
    let key = |(src, dst, _): &(GpuRange<'a>, GpuRange<'a>, usize)| {
        let (a, b) = (
            std::ptr::from_ref(src.buffer) as usize,
            std::ptr::from_ref(dst.buffer) as usize,
        );
        (a.min(b), a.max(b))
    };
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by_key(|&i| key(&pairs[i]));
    let mut words = Vec::new();
    let mut groups: Vec<Group<'a>> = Vec::new();
    for i in order {
        let (src, dst, len) = pairs[i];
        let mine = [src.buffer, dst.buffer];
        let fits = |g: &Group<'a>| {
            let mut regions = g.regions.clone();
            for b in mine {
                if !regions.contains(&b) {
                    regions.push(b);
                }
            }
            regions.len() <= REGIONS
        };
        if !groups.last().is_some_and(fits) {
            groups.push(Group {
                regions: Vec::new(),
                entries: 0,
            });
        }
        let Some(group) = groups.last_mut() else {
            continue;
        };
        for b in mine {
            if !group.regions.contains(&b) {
                group.regions.push(b);
            }
        }
        let region = |b: &wgpu::Buffer| u(group.regions.iter().position(|r| *r == b).unwrap_or(0));
        let bits = region(src.buffer) | (region(dst.buffer) << 1);
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
    (words, groups)
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
        let (words, groups) = plan(&pairs);
        if words.is_empty() {
            return Ok(true);
        }
        self.dev.ctx.with_table(&words, |table| {
            let mut base = 0;
            for g in &groups {
                let region = |i: usize| {
                    let b = g.regions.get(i).or(g.regions.first())?;
                    Some(GpuRange {
                        buffer: b,
                        offset: 0,
                        size: b.size(),
                    })
                };
                let (Some(r0), Some(r1)) = (region(0), region(1)) else {
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
