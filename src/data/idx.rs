//! Reader for the IDX file format of MNIST and Fashion-MNIST.
//!
//! An IDX file is a 4-byte magic number `0x00 0x00 <type> <ndims>`, then `ndims` big-endian
//! `u32` dimension sizes, then the elements in row-major order. Fashion-MNIST uses only the
//! unsigned-byte type `0x08`: `0x00000803` for images (`[n, 28, 28]`) and `0x00000801` for
//! labels (`[n]`). This is the format that `keras.datasets.fashion_mnist.load_data()` reads
//! with `np.frombuffer(..., offset=16)`; here the header is checked instead of skipped.
//!
//! Every malformed input is an [`Error::Data`] naming the file and what is
//! wrong; parsing never panics (the `fuzz/` target checks that).

use std::io::Read;
use std::path::Path;

use crate::{Error, Result};

/// The IDX type byte of unsigned 8-bit elements, the only type this reader supports.
pub const IDX_TYPE_U8: u8 = 0x08;

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// At most this many bytes are reserved up front from the size a gzip'd file's header claims;
/// the buffer still grows past it as data arrives. Keeps a lying header from reserving
/// gigabytes that the stream never delivers.
const MAX_SIZE_HINT: usize = 1 << 28;

/// Bytes decompressed per read.
const CHUNK: usize = 64 << 10;

/// A decoded IDX array of unsigned bytes: its dimensions and its elements in row-major order.
///
/// `data.len()` always equals the product of `dims`.
///
/// ```
/// use anygpu::data::idx::{parse_idx, IdxArray};
/// use std::path::Path;
///
/// // Magic 0x00000801 (unsigned bytes, one dimension), 3 elements.
/// let bytes = [0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1];
/// let labels: IdxArray = parse_idx(&bytes, Path::new("labels")).unwrap();
/// assert_eq!(labels.dims, [3]);
/// assert_eq!(labels.data, [7, 2, 1]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// The dimension sizes, outermost first (`[60000, 28, 28]` for the training images).
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<u8>,
}

impl IdxArray {
    /// The number of items: the first dimension (1 for a zero-dimensional array).
    pub fn len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Whether the array has no items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape of one item: every dimension but the first (`[28, 28]` for images).
    pub fn item_shape(&self) -> &[usize] {
        self.dims.get(1..).unwrap_or(&[])
    }

    /// Encodes the array as an (uncompressed) IDX file of type `0x08`.
    ///
    /// Fails with [`Error::InvalidArgument`] when there are more than 255 dimensions, a
    /// dimension does not fit in `u32`, or `data.len()` is not the product of `dims`.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let ndims = u8::try_from(self.dims.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "an IDX file has at most 255 dimensions, got {}",
                self.dims.len()
            ))
        })?;
        let expected = element_count(&self.dims).ok_or_else(|| {
            Error::InvalidArgument(format!("IDX dimensions {:?} overflow usize", self.dims))
        })?;
        if expected != self.data.len() {
            return Err(Error::InvalidArgument(format!(
                "IDX dimensions {:?} need {expected} elements, got {}",
                self.dims,
                self.data.len()
            )));
        }
        let mut out = Vec::with_capacity(4 + 4 * self.dims.len() + self.data.len());
        out.extend_from_slice(&[0, 0, IDX_TYPE_U8, ndims]);
        for &d in &self.dims {
            let d = u32::try_from(d).map_err(|_| {
                Error::InvalidArgument(format!("IDX dimension {d} does not fit in u32"))
            })?;
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(&self.data);
        Ok(out)
    }
}

/// Reads an IDX file, gzip-compressed or not.
///
/// The file is decompressed when it starts with the gzip magic bytes `1f 8b`, whatever its
/// name; otherwise it is parsed as raw IDX. I/O failures are [`Error::Io`], a corrupt gzip
/// stream or a malformed IDX structure [`Error::Data`], both naming `path`.
///
/// A compressed file is decompressed header first, then at most the data size the header
/// implies and one byte more: a small gzip bomb (a valid header, then gigabytes of zeros) is a
/// trailing-data error after a few kilobytes, not an exhausted memory.
///
/// ```no_run
/// use anygpu::data::idx::read_idx;
/// use std::path::Path;
///
/// let images = read_idx(Path::new("data/fashion-mnist/t10k-images-idx3-ubyte.gz"))?;
/// assert_eq!(images.dims, [10000, 28, 28]);
/// # Ok::<(), anygpu::Error>(())
/// ```
pub fn read_idx(path: &Path) -> Result<IdxArray> {
    let raw = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !raw.starts_with(&GZIP_MAGIC) {
        return parse_idx_owned(raw, path);
    }
    decompress_idx(raw.as_slice(), path)
}

/// Decompresses a gzip'd IDX file from `compressed`, reading no more of it than the header and
/// the data size the header implies need (plus one byte, to detect trailing data).
fn decompress_idx(compressed: impl Read, path: &Path) -> Result<IdxArray> {
    let data_err = |message: String| Error::Data {
        path: path.to_path_buf(),
        message,
    };
    let mut stream = flate2::read::MultiGzDecoder::new(compressed);
    let mut bytes = Vec::new();
    read_at_most(&mut stream, 4, &mut bytes, path)?;
    // Only a well-formed magic number says how long the header is; `parse_dims` reports the rest.
    let ndims = match bytes[..] {
        [0, 0, _, n] => usize::from(n),
        _ => 0,
    };
    read_at_most(&mut stream, 4 * ndims, &mut bytes, path)?;
    let (dims, offset, expected) = parse_dims(&bytes, path)?;
    bytes
        .try_reserve_exact(expected.min(MAX_SIZE_HINT))
        .map_err(|_| {
            data_err(format!(
                "IDX dimensions {dims:?} need {expected} data bytes, more than can be allocated"
            ))
        })?;
    read_at_most(&mut stream, expected.saturating_add(1), &mut bytes, path)?;
    if bytes.len() - offset > expected {
        return Err(data_err(format!(
            "trailing data after the {expected} data bytes of dimensions {dims:?}: the \
             decompressed stream is longer than its header says"
        )));
    }
    parse_idx_owned(bytes, path)
}

/// Appends up to `limit` bytes of `stream` to `bytes` (fewer only at its end), reserving memory
/// fallibly as data arrives.
fn read_at_most(
    stream: &mut impl Read,
    limit: usize,
    bytes: &mut Vec<u8>,
    path: &Path,
) -> Result<()> {
    let err = |message: String| Error::Data {
        path: path.to_path_buf(),
        message,
    };
    let mut chunk = vec![0u8; CHUNK.min(limit)];
    let mut left = limit;
    while left > 0 {
        let want = left.min(chunk.len());
        let n = match stream.read(&mut chunk[..want]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(format!("corrupt gzip data: {e}"))),
        };
        bytes.try_reserve(n).map_err(|_| {
            err(format!(
                "out of memory decompressing: {} bytes read so far",
                bytes.len()
            ))
        })?;
        bytes.extend_from_slice(&chunk[..n]);
        left -= n;
    }
    Ok(())
}

/// Parses an uncompressed IDX file held in memory; `path` is only used in error messages.
///
/// Errors (all [`Error::Data`]): a magic number that is not `0x0000TTNN` (the message shows
/// the bytes found and what was expected, and says so when the bytes are still
/// gzip-compressed), a type other than `0x08`, a truncated header, dimensions whose product
/// overflows `usize`, fewer data bytes than the dimensions need, or bytes after the data.
///
/// ```
/// use anygpu::data::idx::parse_idx;
/// use std::path::Path;
///
/// let err = parse_idx(&[0, 0, 8, 1, 0, 0, 0, 5, 1, 2], Path::new("labels")).unwrap_err();
/// assert!(err.to_string().contains("expected 5 data bytes"));
/// ```
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    let (dims, offset) = parse_header(bytes, path)?;
    let data = bytes.get(offset..).unwrap_or(&[]).to_vec();
    Ok(IdxArray { dims, data })
}

/// [`parse_idx`] on an owned buffer: the header is cut off in place instead of copying the data.
fn parse_idx_owned(mut bytes: Vec<u8>, path: &Path) -> Result<IdxArray> {
    let (dims, offset) = parse_header(bytes.as_slice(), path)?;
    bytes.drain(..offset);
    Ok(IdxArray { dims, data: bytes })
}

/// Validates the whole buffer and returns the dimensions and the offset of the data.
fn parse_header(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, usize)> {
    let (dims, offset, expected) = parse_dims(bytes, path)?;
    let err = |message: String| Error::Data {
        path: path.to_path_buf(),
        message,
    };
    let found = bytes.len() - offset;
    if found < expected {
        return Err(err(format!(
            "truncated IDX data: expected {expected} data bytes for dimensions {dims:?}, found {found}"
        )));
    }
    if found > expected {
        return Err(err(format!(
            "{} trailing bytes after the {expected} data bytes of dimensions {dims:?} \
             (file is {} bytes, expected {})",
            found - expected,
            bytes.len(),
            offset + expected
        )));
    }
    Ok((dims, offset))
}

/// Reads the magic number and the dimensions at the start of `bytes` (the data need not be
/// there): the dimensions, the offset of the data and its length in bytes.
fn parse_dims(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, usize, usize)> {
    let err = |message: String| Error::Data {
        path: path.to_path_buf(),
        message,
    };
    let Some(magic) = bytes.get(..4) else {
        return Err(err(format!(
            "truncated IDX file: {} bytes, too short for the 4-byte magic number",
            bytes.len()
        )));
    };
    if magic[0] != 0 || magic[1] != 0 {
        let found = u32::from_be_bytes([magic[0], magic[1], magic[2], magic[3]]);
        let gzip = if bytes.starts_with(&GZIP_MAGIC) {
            " (these are gzip magic bytes: the data is still compressed; use read_idx)"
        } else {
            ""
        };
        return Err(err(format!(
            "bad IDX magic number 0x{found:08X}{gzip}: expected 0x0000TTNN with type TT and \
             NN dimensions, e.g. 0x00000803 for images or 0x00000801 for labels"
        )));
    }
    let (dtype, ndims) = (magic[2], usize::from(magic[3]));
    if dtype != IDX_TYPE_U8 {
        return Err(err(format!(
            "unsupported IDX data type 0x{dtype:02X} ({}): only 0x08 (unsigned byte) is supported",
            type_name(dtype)
        )));
    }
    let offset = 4 + 4 * ndims;
    let Some(header) = bytes.get(4..offset) else {
        return Err(err(format!(
            "truncated IDX header: {ndims} dimensions need {offset} header bytes, found {}",
            bytes.len()
        )));
    };
    let dims: Vec<usize> = header
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let Some(expected) = element_count(&dims) else {
        return Err(err(format!(
            "IDX dimensions {dims:?} overflow: their product does not fit in usize"
        )));
    };
    Ok((dims, offset, expected))
}

/// The product of `dims`, or `None` on overflow.
fn element_count(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The name of an IDX type byte, for messages.
fn type_name(dtype: u8) -> &'static str {
    match dtype {
        0x08 => "unsigned byte",
        0x09 => "signed byte",
        0x0B => "short",
        0x0C => "int",
        0x0D => "float",
        0x0E => "double",
        _ => "not an IDX type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tmp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("anygpu-idx-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn sample() -> IdxArray {
        let dims = vec![5, 3, 4];
        let data = (0..60u32).map(|i| (i * 37 % 256) as u8).collect();
        IdxArray { dims, data }
    }

    fn msg(bytes: &[u8]) -> String {
        parse_idx(bytes, Path::new("f.idx"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn round_trip_raw_and_gzip() {
        let a = sample();
        let bytes = a.to_bytes().unwrap();
        assert_eq!(&bytes[..4], &[0, 0, 8, 3]);
        assert_eq!(parse_idx(&bytes, Path::new("x")).unwrap(), a);

        let dir = tmp_dir("roundtrip");
        let raw = dir.join("a-idx3-ubyte");
        std::fs::write(&raw, &bytes).unwrap();
        assert_eq!(read_idx(&raw).unwrap(), a);

        // Name says nothing: detection is by magic bytes.
        let gz = dir.join("a-idx3-ubyte.bin");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&bytes).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        let b = read_idx(&gz).unwrap();
        assert_eq!(b, a);
        assert_eq!(b.len(), 5);
        assert_eq!(b.item_shape(), [3, 4]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn labels_and_scalars() {
        let a = IdxArray {
            dims: vec![4],
            data: vec![9, 0, 3, 1],
        };
        let b = parse_idx(&a.to_bytes().unwrap(), Path::new("l")).unwrap();
        assert_eq!(b.item_shape(), &[] as &[usize]);
        let scalar = parse_idx(&[0, 0, 8, 0, 42], Path::new("s")).unwrap();
        assert_eq!(
            (scalar.dims.len(), scalar.data.as_slice()),
            (0, &[42u8][..])
        );
        let empty = parse_idx(&[0, 0, 8, 2, 0, 0, 0, 0, 0, 0, 0, 9], Path::new("e")).unwrap();
        assert!(empty.is_empty() && empty.data.is_empty());
    }

    #[test]
    fn bad_magic() {
        let m = msg(&[1, 2, 8, 1, 0, 0, 0, 0]);
        assert!(
            m.starts_with("f.idx: bad IDX magic number 0x01020801"),
            "{m}"
        );
        assert!(
            m.contains("expected 0x0000TTNN") && m.contains("0x00000803"),
            "{m}"
        );
        let m = msg(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0]);
        assert!(
            m.contains("0x1F8B0800") && m.contains("still compressed"),
            "{m}"
        );
        let m = msg(&[0, 0]);
        assert!(m.contains("too short for the 4-byte magic number"), "{m}");
    }

    #[test]
    fn wrong_type() {
        let m = msg(&[0, 0, 0x0D, 1, 0, 0, 0, 0]);
        assert!(m.contains("unsupported IDX data type 0x0D (float)"), "{m}");
        assert!(m.contains("only 0x08 (unsigned byte)"), "{m}");
    }

    #[test]
    fn truncated() {
        let mut bytes = sample().to_bytes().unwrap();
        bytes.truncate(bytes.len() - 7);
        let m = msg(&bytes);
        assert!(
            m.contains(
                "truncated IDX data: expected 60 data bytes for dimensions [5, 3, 4], found 53"
            ),
            "{m}"
        );
        let m = msg(&[0, 0, 8, 3, 0, 0, 0, 1, 0, 0]);
        assert!(
            m.contains("truncated IDX header: 3 dimensions need 16 header bytes, found 10"),
            "{m}"
        );
    }

    #[test]
    fn trailing_bytes() {
        let mut bytes = sample().to_bytes().unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        let m = msg(&bytes);
        assert!(
            m.contains("3 trailing bytes after the 60 data bytes"),
            "{m}"
        );
    }

    #[test]
    fn overflowing_dims() {
        let mut bytes = vec![0, 0, 8, 4];
        for _ in 0..4 {
            bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        }
        let m = msg(&bytes);
        assert!(m.contains("overflow"), "{m}");
    }

    #[test]
    fn io_and_gzip_errors() {
        let e = read_idx(Path::new("/nonexistent/anygpu/x.gz")).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(
            e.to_string().starts_with("/nonexistent/anygpu/x.gz: "),
            "{e}"
        );

        let dir = tmp_dir("corrupt");
        let p = dir.join("c.gz");
        std::fs::write(&p, [0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        let e = read_idx(&p).unwrap_err();
        assert!(e.to_string().contains("corrupt gzip data"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// A valid 16-label file, then 1 GiB of zeros in 1024 more gzip members (about 1 MB in all):
    /// one member of 1 MiB of zeros compressed once and repeated, so building it is cheap.
    fn gzip_bomb() -> Vec<u8> {
        let labels = IdxArray {
            dims: vec![16],
            data: (0..16).collect(),
        };
        let mut bomb = gzip(&labels.to_bytes().unwrap());
        let zeros = gzip(&vec![0u8; 1 << 20]);
        for _ in 0..1024 {
            bomb.extend_from_slice(&zeros);
        }
        bomb
    }

    /// Counts the bytes read through it.
    struct Counting<'a> {
        inner: &'a [u8],
        read: usize,
    }

    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }

    #[test]
    fn a_gzip_bomb_is_read_no_further_than_its_header_allows() {
        let bomb = gzip_bomb();
        let mut input = Counting {
            inner: &bomb,
            read: 0,
        };
        let e = decompress_idx(&mut input, Path::new("bomb.gz")).unwrap_err();
        assert!(
            e.to_string()
                .contains("trailing data after the 16 data bytes of dimensions [16]"),
            "{e}"
        );
        // Decompressing it all would read every compressed byte (and fill 1 GiB).
        assert!(
            input.read < bomb.len() / 10,
            "read {} of {} compressed bytes for a 16-byte file",
            input.read,
            bomb.len()
        );

        let dir = tmp_dir("bomb");
        let path = dir.join("bomb.gz");
        std::fs::write(&path, &bomb).unwrap();
        let e = read_idx(&path).unwrap_err();
        assert!(matches!(e, Error::Data { .. }), "{e}");
        assert!(e.to_string().contains("trailing data"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_gzip_file_with_one_byte_too_many_or_too_few_is_rejected() {
        let bytes = sample().to_bytes().unwrap();
        let mut longer = bytes.clone();
        longer.push(0);
        let e = decompress_idx(gzip(&longer).as_slice(), Path::new("l.gz")).unwrap_err();
        assert!(
            e.to_string()
                .contains("trailing data after the 60 data bytes"),
            "{e}"
        );
        let shorter = &bytes[..bytes.len() - 1];
        let e = decompress_idx(gzip(shorter).as_slice(), Path::new("s.gz")).unwrap_err();
        assert!(e.to_string().contains("expected 60 data bytes"), "{e}");
        let header_only = &bytes[..6];
        let e = decompress_idx(gzip(header_only).as_slice(), Path::new("h.gz")).unwrap_err();
        assert!(e.to_string().contains("truncated IDX header"), "{e}");
        assert_eq!(
            decompress_idx(gzip(&bytes).as_slice(), Path::new("ok.gz")).unwrap(),
            sample()
        );
    }

    #[test]
    fn to_bytes_rejects_inconsistent_arrays() {
        let a = IdxArray {
            dims: vec![2, 2],
            data: vec![0; 3],
        };
        assert!(matches!(a.to_bytes(), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap in-tree stand-in for the fuzz target: every prefix and some byte flips.
        let bytes = sample().to_bytes().unwrap();
        for n in 0..bytes.len() {
            let _ = parse_idx(&bytes[..n], Path::new("p"));
        }
        for i in 0..16 {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = bytes.clone();
                b[i] = v;
                if let Ok(a) = parse_idx(&b, Path::new("p")) {
                    assert_eq!(Some(a.data.len()), element_count(&a.dims));
                }
            }
        }
    }
}
