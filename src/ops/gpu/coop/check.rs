//! The tensor-core candidates' self-checks: each is run once per adapter against the f64
//! oracle before the tuner may time it, one check for products and one for convolutions, each
//! on first use and with its own verdicts.

use half::f16;

use super::gather::{conv_applies, conv_dims, conv_fits, ConvMode, Gather};
use super::{applies, Work};
use crate::device::LogicalDevice;
use crate::error::Result;
use crate::ops::gpu::kernels::GpuKernels;
use crate::ops::reference;
use crate::ops::spec::{Activation, Conv2dShape, ConvGeometry, Padding};
use crate::ops::MatmulDims;
use crate::shader::coop::{Candidate, CoopSupport, CANDIDATES};
use crate::tensor::Tensor;

/// Shapes of the self-check: ragged (no dimension a multiple of 16, tiles cut at every edge)
/// and one with several tiles each way and several steps of k; each kernel takes those it
/// applies to (k and n multiples of 4 for the vec4 ones).
const CHECK_SHAPES: [(usize, usize, usize); 4] =
    [(37, 45, 51), (100, 70, 131), (37, 44, 52), (100, 72, 132)];

/// The layouts (trans_a, trans_b) of the self-check: every one the dense layers' forward and
/// gradients use, and both transposed (`matmul_transposed`).
const CHECK_LAYOUTS: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

/// A split-k product cut into slices of two steps of k, the last one ragged, as a 1×1
/// convolution's kernel gradient (`xᵀ · dz`) is: `split_slices` gives the shapes above
/// one-step slices, and longer ones only to products of 67M multiply-adds or more (a quarter
/// of a second of the f64 oracle). Split candidates only.
const SPLIT_CHECK: (MatmulDims, usize) = (
    MatmulDims {
        m: 100,
        k: 200,
        n: 132,
        trans_a: true,
        trans_b: false,
    },
    64,
);

/// The self-check's tolerance: four float16 ulps relative to max(1, |expected|), as
/// tests/mixed_precision.rs (products accumulate in float32; the output is rounded once).
const CHECK_TOL: f64 = 4.0 * 0.000_976_562_5;

/// The first element of `got` off `want` by more than [`CHECK_TOL`] (NaN included): its index,
/// value and the expected one.
pub(super) fn first_off<T: Copy + Into<f32>>(got: &[T], want: &[f64]) -> Option<(usize, f32, f64)> {
    got.iter()
        .map(|&g| g.into())
        .zip(want)
        .enumerate()
        .find(|&(_, (g, w))| {
            let close = (f64::from(g) - w).abs() <= CHECK_TOL * w.abs().max(1.0);
            !close
        })
        .map(|(i, (g, w))| (i, g, *w))
}

/// The sum of the `splits` equal layers of `layers` (a split product's partial sums), element
/// by element.
pub(super) fn layer_sums(layers: &[f32], splits: usize) -> Vec<f32> {
    let len = layers.len() / splits.max(1);
    (0..len)
        .map(|i| (0..splits).map(|z| layers[z * len + i]).sum())
        .collect()
}

/// `len` random float16 values in [-1, 1) from `seed`, and the same as f64.
pub(super) fn halves(len: usize, seed: u64) -> (Vec<f64>, Vec<f16>) {
    let h: Vec<f16> = reference::random_vec(len, seed)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    (h.iter().map(|v| f64::from(v.to_f32())).collect(), h)
}

/// `kt[a, b, o, c] = kernel[kh-1-a, kw-1-b, c, o]` of a kernel `[kh, kw, c_in, c_out]` of `s`
/// (what `conv2d_flip` writes on the device).
pub(super) fn flipped<T: Copy>(kernel: &[T], s: &Conv2dShape) -> Vec<T> {
    let (kh, kw, ci, co) = (s.kh, s.kw, s.c_in, s.c_out);
    let mut kt = Vec::with_capacity(kernel.len());
    for a in 0..kh {
        for b in 0..kw {
            for o in 0..co {
                for c in 0..ci {
                    kt.push(kernel[(((kh - 1 - a) * kw + (kw - 1 - b)) * ci + c) * co + o]);
                }
            }
        }
    }
    kt
}

/// The convolutions of the self-check, each candidate taking those it applies to (the vec4
/// ones channels in multiples of 4, the 32-column one at most 32 output channels, the split
/// one every kernel gradient): ragged images and channel counts, 'same' and 'valid' padding,
/// strides and dilation, kernels that are not square, more than 64 output channels; each kind
/// of candidate gets strides and dilation, and each its input gradients at strides above 1.
pub(super) const CONV_CHECKS: [Conv2dShape; 8] = [
    conv_check(2, 9, 7, 12, 20, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(2, 9, 7, 5, 19, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(1, 10, 11, 8, 36, (3, 3), Padding::Valid, [2, 2], [1, 1]),
    conv_check(2, 8, 9, 6, 10, (2, 3), Padding::Same, [1, 1], [2, 2]),
    conv_check(3, 11, 13, 7, 40, (3, 3), Padding::Same, [2, 3], [1, 1]),
    conv_check(2, 11, 10, 12, 28, (2, 3), Padding::Valid, [1, 1], [1, 2]),
    conv_check(1, 7, 6, 8, 72, (3, 3), Padding::Same, [1, 1], [1, 1]),
    conv_check(3, 10, 9, 4, 12, (3, 3), Padding::Same, [3, 2], [1, 1]),
];

#[allow(clippy::too_many_arguments)] // a convolution's every dimension
pub(super) const fn conv_check(
    n: usize,
    h: usize,
    w: usize,
    c_in: usize,
    c_out: usize,
    (kh, kw): (usize, usize),
    padding: Padding,
    strides: [usize; 2],
    dilation: [usize; 2],
) -> Conv2dShape {
    Conv2dShape {
        n,
        h,
        w,
        c_in,
        c_out,
        kh,
        kw,
        padding,
        strides,
        dilation,
    }
}

impl GpuKernels<'_> {
    /// Each candidate's self-check verdict for `work` on this adapter (kept in `support`),
    /// checking on first use: the products' when a product first asks, the convolutions' when
    /// a convolution does (a model without one never pays for their check), so that a
    /// candidate whose gather fails still takes the products.
    pub(super) fn coop_verdicts<'s>(
        &self,
        support: &'s CoopSupport,
        device: &LogicalDevice,
        work: Work,
    ) -> Result<&'s [(&'static str, std::result::Result<(), String>)]> {
        let ctx = &self.dev.ctx;
        let cell = match work {
            Work::Products => &support.verdicts,
            Work::Convolutions => &support.conv_verdicts,
        };
        if let Some(verdicts) = cell.get() {
            return Ok(verdicts);
        }
        // An error of the work before is that work's: it fails the op at hand here, rather
        // than a candidate's check.
        ctx.wait_idle()?;
        Ok(cell.get_or_init(|| {
            // The check waits for the device: a warm-up of a tuned op around this one must
            // not count that time against its candidate.
            ctx.tuner.note_outside_work();
            let mut lost: Option<&str> = None;
            let check = match work {
                Work::Products => Self::coop_self_check,
                Work::Convolutions => Self::coop_conv_self_check,
            };
            CANDIDATES
                .iter()
                .enumerate()
                .map(|(index, c)| {
                    let name = c.name;
                    // After a device failure every check would fail, and blame its kernel.
                    let verdict = match lost {
                        Some(first) => Err(format!(
                            "not checked: the device failed in {first}'s self-check"
                        )),
                        // A kernel the driver does not compile is this candidate's failure,
                        // not the device's.
                        None => match ctx.pipeline(c.kernel, self.name) {
                            Err(e) => Err(e.to_string()),
                            Ok(_) => check(self, device, index, c).unwrap_or_else(|e| {
                                lost = Some(name);
                                Err(format!("the device failed: {e}"))
                            }),
                        },
                    };
                    let what = work.name();
                    match &verdict {
                        Ok(()) => {
                            log::info!("{}: {name} passed its self-check ({what})", self.name)
                        }
                        Err(e) => log::error!(
                            "{}: tensor-core candidate {name} disabled for {what}, its \
                             self-check failed: {e}",
                            self.name
                        ),
                    }
                    (name, verdict)
                })
                .collect()
        }))
    }

    /// Runs candidate `c` (the `index`-th, which seeds its inputs) on float16 products of
    /// [`CHECK_SHAPES`] in every layout the gradients use, with a bias and an activation,
    /// against the f64 oracle. `Err` is a device failure; `Ok(Err)` names the first wrong
    /// output.
    fn coop_self_check(
        &self,
        device: &LogicalDevice,
        index: usize,
        c: &Candidate,
    ) -> Result<std::result::Result<(), String>> {
        let name = c.name;
        let mut products = Vec::new();
        for (s, &(m, k, n)) in CHECK_SHAPES.iter().enumerate() {
            for (l, (trans_a, trans_b)) in CHECK_LAYOUTS.into_iter().enumerate() {
                let d = MatmulDims {
                    m,
                    k,
                    n,
                    trans_a,
                    trans_b,
                };
                let act = [Activation::Relu, Activation::Linear, Activation::Selu][(s + l) % 3];
                products.push((d, act, None));
            }
        }
        if c.split {
            let (d, k_slice) = SPLIT_CHECK;
            products.push((d, Activation::Selu, Some(k_slice)));
        }
        for (p, (d, act, k_slice)) in products.into_iter().enumerate() {
            if !applies(c, d) {
                continue;
            }
            let MatmulDims {
                m,
                k,
                n,
                trans_a,
                trans_b,
            } = d;
            // Each candidate and product its own numbers, and an output of NaN: one that
            // leaves elements unwritten cannot pass on what the last check left in memory.
            let seed = 91_000 + 1_000 * index as u64 + 10 * p as u64;
            let ashape = if trans_a { [k, m] } else { [m, k] };
            let bshape = if trans_b { [n, k] } else { [k, n] };
            let (av, ah) = halves(m * k, seed);
            let (bv, bh) = halves(k * n, seed + 1);
            let (cv, ch) = halves(n, seed + 2);
            let at = Tensor::from_slice_on(&ah, &ashape, device)?;
            let bt = Tensor::from_slice_on(&bh, &bshape, device)?;
            let ct = Tensor::from_slice_on(&ch, &[n], device)?;
            let out = Tensor::from_slice_on(&vec![f16::NAN; m * n], &[m, n], device)?;
            match k_slice {
                Some(k_slice) => {
                    self.coop_split_product(&at, &bt, Some(&ct), &out, d, act, k_slice)?
                }
                None => self.matmul_coop(name, &at, &bt, Some(&ct), &out, d, act)?,
            }
            let got = out.to_vec::<f16>()?;
            let product = reference::matmul(&av, &bv, m, k, n, trans_a, trans_b);
            let want = reference::bias_act(&product, Some(&cv), act);
            if let Some((i, g, w)) = first_off(&got, &want) {
                return Ok(Err(format!(
                    "{m}x{k}x{n} trans_a={trans_a} trans_b={trans_b} {act:?}: out[{}, {}] = {g} \
                     where the f64 oracle has {w:.5}",
                    i / n,
                    i % n
                )));
            }
        }
        Ok(Ok(()))
    }

    /// Runs candidate `c` (the `index`-th, which seeds its inputs) on the float16 convolutions
    /// of [`CONV_CHECKS`] it takes (the forward pass with and without a bias, the input
    /// gradients at strides above 1; the split candidate: every kernel gradient) against the
    /// f64 oracle. `Err` is a device failure; `Ok(Err)` names the first wrong output.
    fn coop_conv_self_check(
        &self,
        device: &LogicalDevice,
        index: usize,
        c: &Candidate,
    ) -> Result<std::result::Result<(), String>> {
        let name = c.name;
        for (q, s) in CONV_CHECKS.iter().enumerate() {
            let g = ConvGeometry::conv(s);
            let seed = 95_000 + 1_000 * index as u64 + 10 * q as u64;
            let what = format!(
                "{}x{}x{}x{}->{} {}x{} {:?} strides {:?} dilation {:?}",
                s.n, s.h, s.w, s.c_in, s.c_out, s.kh, s.kw, s.padding, s.strides, s.dilation
            );
            let (xv, xh) = halves(s.input_len(), seed);
            let x = Tensor::from_slice_on(&xh, &[s.n, s.h, s.w, s.c_in], device)?;
            let (oh, ow) = s.out_hw();
            if c.split {
                // The kernel gradient in slices of two steps of k (pixels), the last ragged.
                let (dzv, dzh) = halves(s.output_len(), seed + 1);
                let dz = Tensor::from_slice_on(&dzh, &[s.n, oh, ow, s.c_out], device)?;
                // The layers added up here: a column sum on the device would be tuned, on
                // these toy shapes, inside the check.
                let d = conv_dims(&g, ConvMode::KernelGrad);
                let (partials, splits) = self.coop_split(&x, &dz, d, 64, Some(&g))?;
                let got = layer_sums(&partials.to_vec::<f32>()?, splits);
                let want = reference::conv2d_backward_kernel(&xv, &dzv, s);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "kernel gradient of {what}: dk[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            } else if conv_fits(&g) && conv_applies(c, &g) {
                let kshape = [s.kh, s.kw, s.c_in, s.c_out];
                let (kv, kh) = halves(s.kernel_len(), seed + 1);
                let (bv, bh) = halves(s.c_out, seed + 2);
                let kernel = Tensor::from_slice_on(&kh, &kshape, device)?;
                let bias = Tensor::from_slice_on(&bh, &[s.c_out], device)?;
                let len = s.output_len();
                let y =
                    Tensor::from_slice_on(&vec![f16::NAN; len], &[s.n, oh, ow, s.c_out], device)?;
                // ReLU would hide a wrong negative output: mostly the others.
                let act = [Activation::Linear, Activation::Selu, Activation::Relu][q % 3];
                let bias = (q % 2 == 0).then_some(&bias);
                let gather = Gather::conv(g);
                self.conv_coop(name, &x, &kernel, bias, &y, &gather, act)?;
                let got = y.to_vec::<f16>()?;
                let bias = (q % 2 == 0).then_some(&bv[..]);
                let want = reference::conv2d_forward(&xv, &kv, bias, s, act);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "{what} {act:?}: y[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            }
            // The input gradient, over dz upsampled by the strides (and dilated taps).
            let gather = Gather::input_grad(&g);
            if !c.split && !s.is_unit_stride() && conv_fits(&gather.g) && conv_applies(c, &gather.g)
            {
                let (kv, kh) = halves(s.kernel_len(), seed + 3);
                let (dzv, dzh) = halves(s.output_len(), seed + 4);
                let kt = flipped(&kh, s);
                let kt = Tensor::from_slice_on(&kt, &[s.kh, s.kw, s.c_out, s.c_in], device)?;
                let dz = Tensor::from_slice_on(&dzh, &[s.n, oh, ow, s.c_out], device)?;
                let len = s.input_len();
                let dx =
                    Tensor::from_slice_on(&vec![f16::NAN; len], &[s.n, s.h, s.w, s.c_in], device)?;
                self.conv_coop(name, &dz, &kt, None, &dx, &gather, Activation::Linear)?;
                let got = dx.to_vec::<f16>()?;
                let want = reference::conv2d_backward_input(&dzv, &kv, s);
                if let Some((i, g, w)) = first_off(&got, &want) {
                    return Ok(Err(format!(
                        "input gradient of {what}: dx[{i}] = {g} where the f64 oracle has {w:.5}"
                    )));
                }
            }
        }
        Ok(Ok(()))
    }
}
