//! What a [`LogicalDevice`] reports of its tensor cores.

use super::Work;
use crate::device::LogicalDevice;
use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;

impl LogicalDevice {
    /// The adapter's cooperative-matrix configurations (tensor cores), as wgpu reports them, when
    /// this device was opened with them: empty on the CPU and on adapters without a
    /// configuration the float16 matrix-product kernels use.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.cooperative_matrix_configs().is_empty());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_configs(&self) -> Vec<wgpu::CooperativeMatrixProperties> {
        self.gpu()
            .map(|g| g.ctx.coop.configs.clone())
            .unwrap_or_default()
    }

    /// Why the tensor-core products do not run on this device (the feature, configuration or
    /// subgroup size its adapter lacks), `None` where they do.
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// assert!(rt.cpu()?.cooperative_matrix_missing().is_some());
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_missing(&self) -> Option<String> {
        match self.gpu() {
            Some(g) => g.ctx.coop.missing.clone(),
            None => Some(format!("{} is no GPU", self.name())),
        }
    }

    /// The kernels on cooperative matrices (tensor cores) the autotuner may offer for float16
    /// products and convolutions on this device, each with its self-checks against the f64
    /// oracle (run here if no op ran them yet): `Ok` when it passed both, else what failed,
    /// for products or for convolutions (a candidate is never offered for the work whose check
    /// it failed). Empty where the adapter has no matching configuration (and on the CPU).
    ///
    /// # Errors
    /// The device's failure, if the work recorded before the check fails (the check waits for
    /// it first).
    ///
    /// ```
    /// let rt = anygpu::Runtime::builder().build()?;
    /// for gpu in rt.list_logical_devices(anygpu::DeviceKind::Gpu)? {
    ///     for (kernel, check) in gpu.cooperative_matrix_kernels()? {
    ///         println!("{kernel}: {check:?}");
    ///     }
    /// }
    /// # Ok::<(), anygpu::Error>(())
    /// ```
    pub fn cooperative_matrix_kernels(
        &self,
    ) -> Result<Vec<(&'static str, std::result::Result<(), String>)>> {
        let Some(g) = self.gpu() else {
            return Ok(Vec::new());
        };
        if !g.ctx.coop.usable() {
            return Ok(Vec::new());
        }
        let kernels = GpuKernels::new(g, self.full_name());
        let products = kernels.coop_verdicts(&g.ctx.coop, self, Work::Products)?;
        let convolutions = kernels.coop_verdicts(&g.ctx.coop, self, Work::Convolutions)?;
        Ok(products
            .iter()
            .zip(convolutions)
            .map(|((name, p), (_, c))| {
                let verdict = match (p, c) {
                    (Ok(()), Ok(())) => Ok(()),
                    (p, c) => Err([("products", p), ("convolutions", c)]
                        .into_iter()
                        .filter_map(|(what, v)| v.as_ref().err().map(|e| format!("{what}: {e}")))
                        .collect::<Vec<_>>()
                        .join("; ")),
                };
                (*name, verdict)
            })
            .collect())
    }
}
