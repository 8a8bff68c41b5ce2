//! Feature standardization after scikit-learn's `sklearn.preprocessing.StandardScaler`.

use crate::{Error, Result};

/// Standardizes features to zero mean and unit variance: `z = (x - mean) / scale`, like
/// scikit-learn's `StandardScaler` (with its defaults `with_mean=True, with_std=True`).
///
/// Data is a row-major matrix of `n_features` columns in a flat slice (one row per example;
/// for images, one feature per pixel). [`fit`](Self::fit) computes each feature's mean and
/// population standard deviation (`ddof=0`, as scikit-learn), accumulating in `f64`; a feature
/// with zero variance gets scale 1, so it is only centered. The attribute names follow
/// scikit-learn: `mean_`, `var_`, `scale_`, `n_features_in_`, `n_samples_seen_`.
///
/// ```
/// use anygpu::data::StandardScaler;
///
/// // Two rows, two features.
/// let mut train = vec![0.0, 5.0, 2.0, 5.0];
/// let mut scaler = StandardScaler::new();
/// scaler.fit(&train, 2)?.transform(&mut train)?;
/// assert_eq!(scaler.mean(), Some(&[1.0, 5.0][..]));
/// assert_eq!(scaler.scale(), Some(&[1.0, 1.0][..])); // feature 1 is constant: scale 1
/// assert_eq!(train, [-1.0, 0.0, 1.0, 0.0]);
/// # Ok::<(), anygpu::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StandardScaler {
    fitted: Option<Fitted>,
}

#[derive(Debug, Clone, PartialEq)]
struct Fitted {
    mean: Vec<f32>,
    var: Vec<f32>,
    scale: Vec<f32>,
    n_samples: usize,
}

impl StandardScaler {
    /// An unfitted scaler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Computes the per-feature mean and standard deviation of `data`, a row-major matrix of
    /// `n_features` columns; replaces any earlier fit. Returns `self` for chaining, like
    /// scikit-learn's `fit`.
    ///
    /// Fails with [`Error::InvalidArgument`] when `n_features` is 0, `data` is empty, or
    /// `data.len()` is not a multiple of `n_features`.
    pub fn fit(&mut self, data: &[f32], n_features: usize) -> Result<&mut Self> {
        if n_features == 0 {
            return Err(Error::InvalidArgument(
                "StandardScaler.fit: n_features must be at least 1".into(),
            ));
        }
        let n_samples = rows(data.len(), n_features, "fit")?;
        if n_samples == 0 {
            return Err(Error::InvalidArgument(format!(
                "StandardScaler.fit: found array with 0 sample(s) (shape=(0, {n_features})) \
                 while a minimum of 1 is required"
            )));
        }
        // Two passes in f64: the mean, then the squared deviations from it (accurate even when
        // the mean is large compared with the spread).
        let mut sum = vec![0.0f64; n_features];
        for row in data.chunks_exact(n_features) {
            for (s, &v) in sum.iter_mut().zip(row) {
                *s += f64::from(v);
            }
        }
        let inv_n = 1.0 / n_samples as f64;
        let mean: Vec<f64> = sum.iter().map(|s| s * inv_n).collect();
        let mut sq = vec![0.0f64; n_features];
        let mut constant = vec![true; n_features];
        let first = &data[..n_features];
        for row in data.chunks_exact(n_features) {
            for j in 0..n_features {
                let d = f64::from(row[j]) - mean[j];
                sq[j] += d * d;
                constant[j] &= row[j] == first[j];
            }
        }
        let var: Vec<f64> = sq.iter().map(|s| s * inv_n).collect();
        let scale = var
            .iter()
            .zip(&constant)
            .map(|(&v, &c)| {
                let std = v.sqrt();
                // scikit-learn's _handle_zeros_in_scale: a (near-)zero scale becomes 1.
                if c || std < 10.0 * f64::EPSILON {
                    1.0
                } else {
                    std as f32
                }
            })
            .collect();
        self.fitted = Some(Fitted {
            mean: mean.iter().map(|&m| m as f32).collect(),
            var: var.iter().map(|&v| v as f32).collect(),
            scale,
            n_samples,
        });
        Ok(self)
    }

    /// Standardizes `data` in place with the fitted mean and scale.
    ///
    /// Fails with [`Error::InvalidArgument`] before [`fit`](Self::fit) (scikit-learn's
    /// `NotFittedError` text) or when `data.len()` is not a multiple of the fitted number of
    /// features. A matrix with another number of features is caught only in that way: the
    /// slice carries no column count.
    pub fn transform(&self, data: &mut [f32]) -> Result<()> {
        let f = self.fitted()?;
        rows(data.len(), f.mean.len(), "transform")?;
        for row in data.chunks_exact_mut(f.mean.len()) {
            for ((v, &m), &s) in row.iter_mut().zip(&f.mean).zip(&f.scale) {
                *v = (*v - m) / s;
            }
        }
        Ok(())
    }

    /// Undoes [`transform`](Self::transform) in place: `x = z * scale + mean`.
    ///
    /// Same errors as `transform`.
    pub fn inverse_transform(&self, data: &mut [f32]) -> Result<()> {
        let f = self.fitted()?;
        rows(data.len(), f.mean.len(), "inverse_transform")?;
        for row in data.chunks_exact_mut(f.mean.len()) {
            for ((v, &m), &s) in row.iter_mut().zip(&f.mean).zip(&f.scale) {
                *v = *v * s + m;
            }
        }
        Ok(())
    }

    /// [`fit`](Self::fit) on `data`, then [`transform`](Self::transform) it in place.
    pub fn fit_transform(&mut self, data: &mut [f32], n_features: usize) -> Result<()> {
        self.fit(data, n_features)?;
        self.transform(data)
    }

    /// The per-feature means (`mean_`), or `None` before `fit`.
    pub fn mean(&self) -> Option<&[f32]> {
        self.fitted.as_ref().map(|f| f.mean.as_slice())
    }

    /// The per-feature population variances (`var_`), or `None` before `fit`.
    pub fn var(&self) -> Option<&[f32]> {
        self.fitted.as_ref().map(|f| f.var.as_slice())
    }

    /// The per-feature scales (`scale_`): standard deviations, with 1 for constant features;
    /// `None` before `fit`.
    pub fn scale(&self) -> Option<&[f32]> {
        self.fitted.as_ref().map(|f| f.scale.as_slice())
    }

    /// The number of features seen by `fit` (`n_features_in_`), or `None` before `fit`.
    pub fn n_features_in(&self) -> Option<usize> {
        self.fitted.as_ref().map(|f| f.mean.len())
    }

    /// The number of rows seen by `fit` (`n_samples_seen_`), or `None` before `fit`.
    pub fn n_samples_seen(&self) -> Option<usize> {
        self.fitted.as_ref().map(|f| f.n_samples)
    }

    fn fitted(&self) -> Result<&Fitted> {
        self.fitted.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "This StandardScaler instance is not fitted yet. Call 'fit' with appropriate \
                 arguments before using this estimator."
                    .into(),
            )
        })
    }
}

/// The number of rows of a flat matrix, or an error naming the operation.
fn rows(len: usize, n_features: usize, op: &str) -> Result<usize> {
    if !len.is_multiple_of(n_features) {
        return Err(Error::InvalidArgument(format!(
            "StandardScaler.{op}: data of length {len} is not a whole number of rows of \
             {n_features} features (StandardScaler is expecting {n_features} features as input)"
        )));
    }
    Ok(len / n_features)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn matches_a_direct_f64_computation() {
        let (n, f) = (1000, 13);
        let mut rng = SplitMix64::new(11);
        // Different offsets and spreads per feature, large offsets included.
        let data: Vec<f32> = (0..n * f)
            .map(|k| {
                let j = k % f;
                (rng.uniform() * (j as f64 + 0.5) + 1000.0 * j as f64) as f32
            })
            .collect();
        let mut s = StandardScaler::new();
        let mut z = data.clone();
        s.fit_transform(&mut z, f).unwrap();
        assert_eq!(s.n_features_in(), Some(f));
        assert_eq!(s.n_samples_seen(), Some(n));
        for j in 0..f {
            let col: Vec<f64> = (0..n).map(|i| f64::from(data[i * f + j])).collect();
            let mean = col.iter().sum::<f64>() / n as f64;
            let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            let std = var.sqrt();
            assert!((f64::from(s.mean().unwrap()[j]) - mean).abs() <= 1e-6 * mean.abs().max(1.0));
            assert!((f64::from(s.var().unwrap()[j]) - var).abs() <= 1e-6 * var);
            assert!((f64::from(s.scale().unwrap()[j]) - std).abs() <= 1e-6 * std);
            for i in 0..n {
                let want = (col[i] - mean) / std;
                let got = f64::from(z[i * f + j]);
                assert!(
                    (got - want).abs() < 1e-3,
                    "feature {j} row {i}: {got} vs {want}"
                );
            }
            let zc: Vec<f64> = (0..n).map(|i| f64::from(z[i * f + j])).collect();
            let zm = zc.iter().sum::<f64>() / n as f64;
            let zv = zc.iter().map(|v| (v - zm).powi(2)).sum::<f64>() / n as f64;
            assert!(zm.abs() < 1e-3 && (zv - 1.0).abs() < 1e-3, "{zm} {zv}");
        }
        s.inverse_transform(&mut z).unwrap();
        for (a, b) in z.iter().zip(&data) {
            assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn constant_features_get_scale_one() {
        let mut d = vec![3.0, 1.0, 3.0, 2.0, 3.0, 3.0];
        let mut s = StandardScaler::new();
        s.fit_transform(&mut d, 2).unwrap();
        assert_eq!(s.scale().unwrap()[0], 1.0);
        assert_eq!(s.var().unwrap()[0], 0.0);
        assert_eq!([d[0], d[2], d[4]], [0.0; 3]);
        // 0.1 is not exact in binary: the mean of constant 0.1s may not be 0.1 to the last bit.
        let mut d = vec![0.1f32; 7];
        s.fit_transform(&mut d, 1).unwrap();
        assert_eq!(s.scale(), Some(&[1.0][..]));
        assert!(d.iter().all(|v| v.abs() < 1e-7));
    }

    #[test]
    fn errors() {
        let mut s = StandardScaler::new();
        let m = s.transform(&mut [1.0]).unwrap_err().to_string();
        assert!(m.contains("not fitted yet"), "{m}");
        assert_eq!(s.mean(), None);
        let m = s.fit(&[1.0, 2.0, 3.0], 2).unwrap_err().to_string();
        assert!(m.contains("length 3") && m.contains("2 features"), "{m}");
        assert!(s
            .fit(&[], 2)
            .unwrap_err()
            .to_string()
            .contains("0 sample(s)"));
        assert!(s.fit(&[1.0], 0).is_err());
        s.fit(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3).unwrap();
        let m = s.transform(&mut [0.0; 4]).unwrap_err().to_string();
        assert!(m.contains("expecting 3 features"), "{m}");
        assert!(s.inverse_transform(&mut [0.0; 2]).is_err());
        s.transform(&mut [0.0; 6]).unwrap();
    }
}
