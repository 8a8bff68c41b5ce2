//! Element counts and byte sizes of shapes, in arithmetic that cannot wrap.
//!
//! A shape is valid for a dtype when the product of its non-zero dimensions, in bytes, is at
//! most `isize::MAX` (the most any allocation can hold). Zero dimensions are left out on
//! purpose: then every partial product of one tensor's dimensions fits too, in whatever order a
//! kernel forms it, and `[0, 1 << 62, 1 << 62]` is rejected rather than counted as empty.
//! TensorFlow's rule ("Shape [...] would have more than 2**63 - 1 elements") depends on the
//! order of the dimensions; ours does not.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The product of `dims`, or `None` when it does not fit in `usize` (any zero makes it 0).
pub(crate) fn product(dims: &[usize]) -> Option<usize> {
    if dims.contains(&0) {
        return Some(0);
    }
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Elements of a tensor of `shape` and `dtype`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the shape when its non-zero dimensions take more than
/// `isize::MAX` bytes.
pub(crate) fn num_elements(shape: &[usize], dtype: DType) -> Result<usize> {
    let bytes = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    match bytes {
        // The non-zero dimensions' product fits, so the full one does.
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(product(shape).unwrap_or(0)),
        _ => Err(too_many_elements(shape, dtype)),
    }
}

fn too_many_elements(shape: &[usize], dtype: DType) -> Error {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let bits = usize::BITS - 1 - dtype.size().trailing_zeros();
    Error::InvalidArgument(format!(
        "Shape [{}] would have more than 2**{bits} - 1 elements of type {dtype} (an allocation \
         holds at most isize::MAX bytes)",
        dims.join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_that_wraps_is_none_unless_a_dimension_is_zero() {
        assert_eq!(product(&[(1 << 60) + 1, 16]), None);
        assert_eq!(product(&[1 << 62, 1 << 62, 0]), Some(0));
        assert_eq!(product(&[]), Some(1));
        assert_eq!(product(&[3, 5]), Some(15));
    }

    #[test]
    fn the_issues_shape_is_an_invalid_argument_naming_it() {
        let err = num_elements(&[(1 << 60) + 1, 16], DType::F32).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(text.contains("[1152921504606846977,16]"), "{text}");
    }

    #[test]
    fn zero_dimensions_do_not_hide_an_overflowing_sub_product() {
        assert!(num_elements(&[0, 1 << 62, 1 << 62], DType::F32).is_err());
        assert_eq!(
            num_elements(&[0, 1 << 40, 1 << 20], DType::F32).ok(),
            Some(0)
        );
    }

    #[test]
    fn the_limit_is_isize_max_bytes() {
        let max = isize::MAX as usize / 4;
        assert_eq!(num_elements(&[max], DType::F32).ok(), Some(max));
        assert!(num_elements(&[max + 1], DType::F32).is_err());
    }
}
