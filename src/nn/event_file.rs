//! TensorBoard event files, written without TensorFlow: TFRecord framing around `Event`
//! protobufs (encoded by `prost`, checksummed by `crc32c`).
//!
//! A record is `u64 length`, `u32 masked_crc32c(length bytes)`, `data`,
//! `u32 masked_crc32c(data)`, all little-endian (TensorFlow's `tensorflow/core/lib/io/record_writer.cc`).
//! The messages are the few fields TensorBoard reads of `tensorflow/core/util/event.proto` and
//! `tensorflow/core/framework/summary.proto`, declared below with their field numbers.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::error::{Error, Result};

/// TFRecord's masked CRC-32C: a CRC of data that itself holds CRCs would be weak, so it is
/// rotated and offset (`tensorflow/core/lib/hash/crc32c.h`, `Mask`).
pub(crate) fn masked_crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the data, its masked CRC.
pub(crate) fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// `tensorflow.Event` (the fields written here).
#[derive(Clone, PartialEq, prost::Message)]
struct EventProto {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "EventWhat", tags = "3, 5")]
    what: Option<EventWhat>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum EventWhat {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(SummaryProto),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryProto {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValueProto>,
}

/// `tensorflow.Summary.Value`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValueProto {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(oneof = "SummaryValueKind", tags = "2, 5")]
    value: Option<SummaryValueKind>,
}

/// `Summary.Value.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum SummaryValueKind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    #[prost(message, tag = "5")]
    Histo(HistogramProto),
}

/// `tensorflow.HistogramProto` (proto3: the repeated doubles are packed).
#[derive(Clone, PartialEq, prost::Message)]
struct HistogramProto {
    #[prost(double, tag = "1")]
    min: f64,
    #[prost(double, tag = "2")]
    max: f64,
    #[prost(double, tag = "3")]
    num: f64,
    #[prost(double, tag = "4")]
    sum: f64,
    #[prost(double, tag = "5")]
    sum_squares: f64,
    #[prost(double, repeated, tag = "6")]
    bucket_limit: Vec<f64>,
    #[prost(double, repeated, tag = "7")]
    bucket: Vec<f64>,
}

/// A histogram in TensorFlow's `HistogramProto`: bucket `i` counts the values in
/// `(bucket_limit[i-1], bucket_limit[i]]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Histogram {
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) num: f64,
    pub(crate) sum: f64,
    pub(crate) sum_squares: f64,
    pub(crate) bucket_limit: Vec<f64>,
    pub(crate) bucket: Vec<f64>,
}

impl Histogram {
    /// `values` in `buckets` equal-width buckets between their minimum and maximum (one bucket
    /// when they are all equal); `None` for no values or a non-finite one.
    pub(crate) fn of(values: &[f32], buckets: usize) -> Option<Histogram> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) || buckets == 0 {
            return None;
        }
        let (mut min, mut max, mut sum, mut sum_squares) = (f64::MAX, f64::MIN, 0.0, 0.0);
        for &v in values {
            let v = f64::from(v);
            min = min.min(v);
            max = max.max(v);
            sum += v;
            sum_squares += v * v;
        }
        let buckets = if max > min { buckets } else { 1 };
        let width = (max - min) / buckets as f64;
        let mut bucket = vec![0.0; buckets];
        for &v in values {
            // Upper bounds are inclusive, as in TensorFlow's `HistogramProto`.
            let i = if width > 0.0 {
                let upper = ((f64::from(v) - min) / width).ceil() as usize;
                upper.saturating_sub(1).min(buckets - 1)
            } else {
                0
            };
            bucket[i] += 1.0;
        }
        let bucket_limit = (1..=buckets)
            .map(|i| {
                if i == buckets {
                    max
                } else {
                    min + width * i as f64
                }
            })
            .collect();
        Some(Histogram {
            min,
            max,
            num: values.len() as f64,
            sum,
            sum_squares,
            bucket_limit,
            bucket,
        })
    }

    fn proto(&self) -> HistogramProto {
        HistogramProto {
            min: self.min,
            max: self.max,
            num: self.num,
            sum: self.sum,
            sum_squares: self.sum_squares,
            bucket_limit: self.bucket_limit.clone(),
            bucket: self.bucket.clone(),
        }
    }
}

/// What one summary value holds.
pub(crate) enum Value<'a> {
    Scalar(f32),
    Histogram(&'a Histogram),
}

/// An `Event` with `file_version`: the first record of every event file.
fn file_version_event(wall_time: f64) -> Vec<u8> {
    EventProto {
        wall_time,
        step: 0,
        what: Some(EventWhat::FileVersion("brain.Event:2".into())),
    }
    .encode_to_vec()
}

/// An `Event` holding one summary value.
pub(crate) fn summary_event(wall_time: f64, step: i64, tag: &str, value: Value<'_>) -> Vec<u8> {
    let value = match value {
        Value::Scalar(x) => SummaryValueKind::SimpleValue(x),
        Value::Histogram(h) => SummaryValueKind::Histo(h.proto()),
    };
    let summary = SummaryProto {
        value: vec![SummaryValueProto {
            tag: tag.into(),
            value: Some(value),
        }],
    };
    EventProto {
        wall_time,
        step,
        what: Some(EventWhat::Summary(summary)),
    }
    .encode_to_vec()
}

/// Seconds since the Unix epoch, as TensorFlow stamps events.
pub(crate) fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The machine's name for the file name, as TensorFlow puts it there; `localhost` where it
/// cannot be read.
fn hostname() -> String {
    let from_proc = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let name = from_proc
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// An open event file: `dir/events.out.tfevents.<secs>.<hostname>.<pid>.v2`, its
/// `file_version` event written on creation; every later event is appended whole.
pub(crate) struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
    /// Creates `dir` (when needed) and a new event file in it.
    pub(crate) fn create(dir: &Path) -> Result<EventFile> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let now = wall_time();
        let stem = format!(
            "events.out.tfevents.{}.{}.{}",
            now as u64,
            hostname(),
            std::process::id()
        );
        // Two writers in one second (two fits in a test) get `.1.v2`, `.2.v2`, ...
        for n in 0u32.. {
            let name = match n {
                0 => format!("{stem}.v2"),
                n => format!("{stem}.{n}.v2"),
            };
            let path = dir.join(name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    let mut events = EventFile { path, file };
                    events.append(&[file_version_event(now)])?;
                    return Ok(events);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io(&path)(e)),
            }
        }
        unreachable!("u32 file-name suffixes run out only after 4 billion files")
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `events`, each framed as a record, in one write, and flushes them to the OS so
    /// a TensorBoard reading along sees them at once. All or nothing: see [`append_records`].
    pub(crate) fn append(&mut self, events: &[Vec<u8>]) -> Result<()> {
        append_records(&mut self.file, &self.path, events)
    }
}

/// What appending needs of an event file besides writing: cutting a torn append back off.
/// A trait so that the tests can stand in a disk that fills up in the middle of a record.
pub(crate) trait RecordSink: Write + Seek {
    /// Cuts the sink to `len` bytes ([`File::set_len`]).
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl RecordSink for File {
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

/// Appends `events` to `sink` (the file at `path`), each framed as a record, all or nothing.
///
/// A full disk can take part of a write: TensorBoard's reader stops at a torn record and
/// everything appended after it would be lost. So the records go out in one write, and when it
/// fails the sink is cut back to its length before the append, leaving it ending on a whole
/// record. Should that cut fail too, the error says the file may end in a torn record.
pub(crate) fn append_records<S: RecordSink>(
    sink: &mut S,
    path: &Path,
    events: &[Vec<u8>],
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes: Vec<u8> = events.iter().flat_map(|e| record(e)).collect();
    let start = sink.stream_position().map_err(io)?;
    let Err(write_error) = sink.write_all(&bytes).and_then(|()| sink.flush()) else {
        return Ok(());
    };
    // Back to `start` in length and position, so the next append lands right after the last
    // whole record.
    let rolled_back = sink
        .truncate(start)
        .and_then(|()| sink.seek(SeekFrom::Start(start)));
    Err(io(match rolled_back {
        Ok(_) => write_error,
        Err(cut_error) => std::io::Error::new(
            write_error.kind(),
            format!(
                "{write_error}; cutting the file back to {start} bytes failed too ({cut_error}), \
                 so it may end in a torn record"
            ),
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{self, Cursor};

    /// A disk with room for `room` bytes: a write past it stores what fits and fails, as
    /// `write(2)` does on a full disk; with `cut_fails`, truncating fails too.
    struct SmallDisk {
        data: Cursor<Vec<u8>>,
        room: u64,
        cut_fails: bool,
    }

    impl SmallDisk {
        fn new(room: u64) -> SmallDisk {
            SmallDisk {
                data: Cursor::new(Vec::new()),
                room,
                cut_fails: false,
            }
        }

        fn bytes(&self) -> &[u8] {
            self.data.get_ref()
        }
    }

    impl Write for SmallDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let left = self.room.saturating_sub(self.data.position());
            let fits = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            if fits == 0 && !buf.is_empty() {
                return Err(io::ErrorKind::StorageFull.into());
            }
            self.data.write(&buf[..fits])
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Seek for SmallDisk {
        fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
            self.data.seek(to)
        }
    }

    impl RecordSink for SmallDisk {
        fn truncate(&mut self, len: u64) -> io::Result<()> {
            if self.cut_fails {
                return Err(io::Error::other("read-only file system"));
            }
            self.data.get_mut().truncate(usize::try_from(len).unwrap());
            Ok(())
        }
    }

    /// The data of the TFRecords in `bytes`, every length and data CRC checked; panics on a
    /// bad CRC or a torn record, trailing bytes included.
    fn read_records(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let u32_at = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let n = out.len();
            assert!(bytes.len() >= 12, "record {n}: torn header");
            let (len, rest) = bytes.split_at(8);
            assert_eq!(u32_at(rest), masked_crc32c(len), "record {n}: length CRC");
            let len = usize::try_from(u64::from_le_bytes(len.try_into().unwrap())).unwrap();
            assert!(rest.len() >= 4 + len + 4, "record {n}: torn data");
            let (data, rest) = rest[4..].split_at(len);
            assert_eq!(u32_at(rest), masked_crc32c(data), "record {n}: data CRC");
            out.push(data.to_vec());
            bytes = &rest[4..];
        }
        out
    }

    fn events(tags: &[&str]) -> Vec<Vec<u8>> {
        tags.iter()
            .map(|tag| summary_event(1.0, 2, tag, Value::Scalar(0.5)))
            .collect()
    }

    #[test]
    fn a_disk_that_fills_mid_record_keeps_only_whole_records() {
        let path = Path::new("logs/train/events.v2");
        let (first, second, third) = (events(&["a"]), events(&["b", "c"]), events(&["d"]));
        let whole: Vec<u8> = [&first, &second]
            .into_iter()
            .flatten()
            .flat_map(|e| record(e))
            .collect();
        // Room for the first two appends and half of the third's record.
        let mut disk = SmallDisk::new((whole.len() + record(&third[0]).len() / 2) as u64);
        append_records(&mut disk, path, &first).unwrap();
        append_records(&mut disk, path, &second).unwrap();

        let err = append_records(&mut disk, path, &third).unwrap_err();
        match &err {
            Error::Io { path: p, source } => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), io::ErrorKind::StorageFull);
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        assert_eq!(disk.bytes(), &whole[..], "the torn record was not cut off");
        assert_eq!(read_records(disk.bytes()), [first, second.clone()].concat());

        // Once there is room again, the next record follows the last whole one.
        disk.room = u64::MAX;
        append_records(&mut disk, path, &third).unwrap();
        let records = read_records(disk.bytes());
        assert_eq!(records.len(), 4);
        assert_eq!(records[3], third[0]);
    }

    #[test]
    fn a_failed_cut_back_says_the_file_may_end_torn() {
        let path = Path::new("logs/train/events.v2");
        let mut disk = SmallDisk::new(20);
        disk.cut_fails = true;
        let err = append_records(&mut disk, path, &events(&["a"])).unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("logs/train/events.v2: "), "{message}");
        assert!(
            message.contains("cutting the file back to 0 bytes failed too"),
            "{message}"
        );
        assert!(message.contains("read-only file system"), "{message}");
        assert!(
            message.ends_with("so it may end in a torn record"),
            "{message}"
        );
    }

    /// A real `File` that takes no byte at all, and (a device, not a regular file) cannot be
    /// cut either: the error is the write's, with the failed cut named.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_event_file_on_dev_full_reports_the_failed_append() {
        let Ok(file) = File::options().write(true).open("/dev/full") else {
            return; // No /dev/full in this sandbox.
        };
        let path = PathBuf::from("/dev/full");
        let mut events_file = EventFile { path, file };
        let message = events_file.append(&events(&["a"])).unwrap_err().to_string();
        assert!(message.starts_with("/dev/full: "), "{message}");
        assert!(message.contains("torn record"), "{message}");
    }

    #[test]
    fn masked_crc_is_tensorflows_mask() {
        // Computed bit by bit outside the crate: crc32c("abc") = 0x364b3fb7, masked with
        // ((crc >> 15) | (crc << 17)) + 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"abc"), 0x364B_3FB7);
        assert_eq!(masked_crc32c(b"abc"), 0x21F1_576E);
    }

    #[test]
    fn a_scalar_event_has_the_fields_tensorboard_reads() {
        let e = summary_event(1.5, 3, "epoch_loss", Value::Scalar(0.25));
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 3, 0x2a, 19, 0x0a, 17, 0x0a, 10]);
        expected.extend_from_slice(b"epoch_loss");
        expected.push(0x15);
        expected.extend_from_slice(&0.25f32.to_le_bytes());
        assert_eq!(e, expected);
    }

    #[test]
    fn a_histogram_counts_every_value_once() {
        let h = Histogram::of(&[0.0, 1.0, 2.0, 3.0, 4.0], 4).unwrap();
        assert_eq!(h.bucket, vec![2.0, 1.0, 1.0, 1.0]);
        assert_eq!(h.bucket_limit, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!((h.min, h.max, h.num, h.sum), (0.0, 4.0, 5.0, 10.0));
        let flat = Histogram::of(&[2.0; 3], 30).unwrap();
        assert_eq!(
            (flat.bucket.clone(), flat.bucket_limit.clone()),
            (vec![3.0], vec![2.0])
        );
        assert!(Histogram::of(&[], 4).is_none());
        assert!(Histogram::of(&[f32::NAN], 4).is_none());
    }
}
