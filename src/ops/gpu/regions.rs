//! Table-driven dispatches over whole arena regions (the fused update, the weights' casts to
//! float16): each table entry names its tensors by region and offset, and consecutive entries
//! share a dispatch while their tensors lie in at most as many regions as the kernel binds.

use crate::device::logical::GpuRange;

/// Consecutive table entries whose tensors lie in the same few regions: one dispatch.
pub(crate) struct Group<'a> {
    pub(crate) regions: Vec<&'a wgpu::Buffer>,
    pub(crate) entries: usize,
}

impl<'a> Group<'a> {
    /// Region binding `i` of the group's dispatch: unused ones repeat the first region (never
    /// read through them). `None` for a group without regions.
    pub(crate) fn region(&self, i: usize) -> Option<GpuRange<'_>> {
        let b = self.regions.get(i).or(self.regions.first())?;
        Some(GpuRange {
            buffer: b,
            offset: 0,
            size: b.size(),
        })
    }

    /// The binding index of `buffer` among the group's regions.
    pub(crate) fn index_of(&self, buffer: &wgpu::Buffer) -> Option<u32> {
        let i = self.regions.iter().position(|b| *b == buffer)?;
        Some(i as u32)
    }
}

/// The distinct regions of an entry's tensors, and a key (their addresses, sorted) that puts
/// entries sharing regions side by side when the entries are sorted by it.
pub(crate) fn regions_of<'a>(
    buffers: impl IntoIterator<Item = &'a wgpu::Buffer>,
) -> (Vec<&'a wgpu::Buffer>, Vec<usize>) {
    let mut mine: Vec<&'a wgpu::Buffer> = Vec::new();
    for b in buffers {
        if !mine.contains(&b) {
            mine.push(b);
        }
    }
    let mut key: Vec<usize> = mine
        .iter()
        .map(|&b| std::ptr::from_ref(b) as usize)
        .collect();
    key.sort_unstable();
    (mine, key)
}

/// The group an entry over the regions `mine` joins: the last one while the regions fit in
/// `max` bindings, else a new one; `mine` is added to it.
pub(crate) fn join<'g, 'a>(
    groups: &'g mut Vec<Group<'a>>,
    mine: &[&'a wgpu::Buffer],
    max: usize,
) -> &'g mut Group<'a> {
    let fits = |g: &Group<'a>| {
        let new = mine.iter().filter(|b| !g.regions.contains(b)).count();
        g.regions.len() + new <= max
    };
    if !groups.last().is_some_and(fits) {
        groups.push(Group {
            regions: Vec::new(),
            entries: 0,
        });
    }
    let last = groups.len() - 1;
    let group = &mut groups[last];
    for &b in mine {
        if !group.regions.contains(&b) {
            group.regions.push(b);
        }
    }
    group
}
