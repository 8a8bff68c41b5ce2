//! `nn::TensorBoard` writes event files TensorBoard reads: every record's framing and CRCs
//! check, and every value agrees with the `History` of the same `fit`.
//!
//! The files are read back with the decoder below, written from the format's definition
//! (TFRecord framing, `Event`/`Summary` protobufs) and independent of the crate's encoder; its
//! CRC32C is the bit-by-bit form, not the crate's table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anygpu::data::Dataset;
use anygpu::nn::{
    Activation, Adam, BackupAndRestore, Dense, History, Loss, Metric, Sequential, TensorBoard,
    Verbosity,
};

/// CRC-32C, one bit at a time.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked(bytes: &[u8]) -> u32 {
    crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The records of a TFRecord file, every length and data CRC checked.
fn records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.len() < 12 {
            return Err(format!("{} trailing bytes", rest.len()));
        }
        let len_bytes = &rest[..8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(rest[8..12].try_into().unwrap());
        if len_crc != masked(len_bytes) {
            return Err(format!("record {}: bad length CRC", out.len()));
        }
        if rest.len() < 12 + len + 4 {
            return Err(format!("record {}: truncated", out.len()));
        }
        let data = &rest[12..12 + len];
        let data_crc = u32::from_le_bytes(rest[12 + len..16 + len].try_into().unwrap());
        if data_crc != masked(data) {
            return Err(format!("record {}: bad data CRC", out.len()));
        }
        out.push(data.to_vec());
        rest = &rest[16 + len..];
    }
    Ok(out)
}

/// A protobuf field's value, by wire type.
#[derive(Clone, Debug)]
enum Field {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = bytes[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
    }
    v
}

/// Every field of a message, by number, in order.
fn fields(bytes: &[u8]) -> BTreeMap<u32, Vec<Field>> {
    let mut out: BTreeMap<u32, Vec<Field>> = BTreeMap::new();
    let mut at = 0;
    while at < bytes.len() {
        let key = varint(bytes, &mut at);
        let value = match key & 7 {
            0 => Field::Varint(varint(bytes, &mut at)),
            1 => {
                at += 8;
                Field::Fixed64(bytes[at - 8..at].try_into().unwrap())
            }
            2 => {
                let len = varint(bytes, &mut at) as usize;
                at += len;
                Field::Bytes(bytes[at - len..at].to_vec())
            }
            5 => {
                at += 4;
                Field::Fixed32(bytes[at - 4..at].try_into().unwrap())
            }
            other => panic!("unexpected wire type {other}"),
        };
        out.entry((key >> 3) as u32).or_default().push(value);
    }
    out
}

fn one(f: &BTreeMap<u32, Vec<Field>>, n: u32) -> Option<Field> {
    f.get(&n).and_then(|v| v.first().cloned())
}

/// What an event holds.
#[derive(Debug, PartialEq)]
enum Event {
    FileVersion(String),
    Scalar {
        step: i64,
        tag: String,
        value: f32,
    },
    Histogram {
        step: i64,
        tag: String,
        num: f64,
        min: f64,
        max: f64,
        counted: f64,
    },
}

fn event(bytes: &[u8]) -> Event {
    let e = fields(bytes);
    let Some(Field::Fixed64(wall)) = one(&e, 1) else {
        panic!("no wall_time")
    };
    assert!(
        f64::from_le_bytes(wall) > 1.6e9,
        "wall_time is seconds since 1970"
    );
    if let Some(Field::Bytes(v)) = one(&e, 3) {
        return Event::FileVersion(String::from_utf8(v).unwrap());
    }
    let step = match one(&e, 2) {
        Some(Field::Varint(s)) => s as i64,
        None => 0,
        other => panic!("step {other:?}"),
    };
    let Some(Field::Bytes(summary)) = one(&e, 5) else {
        panic!("no summary")
    };
    let values = fields(&summary);
    assert_eq!(values[&1].len(), 1, "one value per event");
    let Field::Bytes(value) = &values[&1][0] else {
        panic!("value")
    };
    let v = fields(value);
    let Some(Field::Bytes(tag)) = one(&v, 1) else {
        panic!("no tag")
    };
    let tag = String::from_utf8(tag).unwrap();
    match (one(&v, 2), one(&v, 5)) {
        (Some(Field::Fixed32(x)), None) => Event::Scalar {
            step,
            tag,
            value: f32::from_le_bytes(x),
        },
        (None, Some(Field::Bytes(h))) => {
            let h = fields(&h);
            let double = |n| match one(&h, n) {
                Some(Field::Fixed64(b)) => f64::from_le_bytes(b),
                other => panic!("histogram field {n}: {other:?}"),
            };
            let packed = |n| match one(&h, n) {
                Some(Field::Bytes(b)) => b
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect::<Vec<_>>(),
                other => panic!("histogram field {n}: {other:?}"),
            };
            let (limits, buckets) = (packed(6), packed(7));
            assert_eq!(limits.len(), buckets.len());
            assert!(
                limits.windows(2).all(|w| w[0] < w[1]),
                "limits ascend: {limits:?}"
            );
            Event::Histogram {
                step,
                tag,
                num: double(3),
                min: double(1),
                max: double(2),
                counted: buckets.iter().sum(),
            }
        }
        other => panic!("value of {tag}: {other:?}"),
    }
}

/// The events of one file; its first must be the file version.
fn events(path: &Path) -> Vec<Event> {
    let bytes = std::fs::read(path).unwrap();
    let records = records(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let events: Vec<Event> = records.iter().map(|r| event(r)).collect();
    assert_eq!(events[0], Event::FileVersion("brain.Event:2".into()));
    events
}

/// The scalars tagged `tag`, as (step, value).
fn scalars(events: &[Event], tag: &str) -> Vec<(i64, f32)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Scalar {
                step,
                tag: t,
                value,
            } if t == tag => Some((*step, *value)),
            _ => None,
        })
        .collect()
}

fn per_epoch(series: &[f64]) -> Vec<(i64, f32)> {
    series
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as i64, v as f32))
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anygpu-tb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// 3 epochs of 4 steps on CPU:0, validated, logged with `tensorboard`.
fn train(tensorboard: &mut TensorBoard) -> (Sequential, History) {
    let _cpu = anygpu::with_device("/cpu:0").unwrap();
    let mut model = Sequential::with_seed(3);
    model
        .add(Dense::new(4).activation(Activation::Relu).input_shape(&[2]))
        .unwrap();
    model
        .add(Dense::new(2).activation(Activation::Softmax))
        .unwrap();
    model
        .compile(
            Loss::sparse_categorical_crossentropy(),
            Adam::new(0.05),
            &[Metric::Accuracy],
        )
        .unwrap();
    model.set_verbose(Verbosity::Silent);
    let x: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 / 5.0 - 0.4).collect();
    let y = vec![0, 1, 1, 0, 1, 0, 0, 1];
    let data = Dataset::from_tensor_slices(x.clone(), &[2], y.clone())
        .unwrap()
        .batch(2, false);
    let valid = Dataset::from_tensor_slices(x, &[2], y)
        .unwrap()
        .batch(3, false);
    let history = model
        .fit_with_callbacks(&data, 3, None, Some(&valid), &mut [tensorboard])
        .unwrap();
    (model, history)
}

#[test]
fn event_files_round_trip_against_the_history() {
    let dir = scratch("round-trip");
    let mut tensorboard = TensorBoard::new(&dir).update_freq(3).histogram_freq(2);
    let (model, history) = train(&mut tensorboard);
    assert_eq!(history.epochs(), 3);

    let train_file = tensorboard
        .train_file()
        .expect("a training file")
        .to_path_buf();
    let validation_file = tensorboard
        .validation_file()
        .expect("a validation file")
        .to_path_buf();
    assert_eq!(train_file.parent(), Some(dir.join("train").as_path()));
    assert_eq!(
        validation_file.parent(),
        Some(dir.join("validation").as_path())
    );
    let name = train_file
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("events.out.tfevents.")
            && name.ends_with(&format!(".{}.v2", std::process::id())),
        "Keras' file name: {name}"
    );

    let train = events(&train_file);
    assert_eq!(scalars(&train, "epoch_loss"), per_epoch(&history.loss));
    assert_eq!(
        scalars(&train, "epoch_accuracy"),
        per_epoch(&history.accuracy)
    );
    assert_eq!(
        scalars(&train, "epoch_learning_rate"),
        per_epoch(&[0.05; 3])
    );
    // Every 3rd of 12 steps; the last is the end of epoch 3, whose running mean is its loss.
    let batch_loss = scalars(&train, "batch_loss");
    assert_eq!(
        batch_loss.iter().map(|s| s.0).collect::<Vec<_>>(),
        [3, 6, 9, 12]
    );
    assert_eq!(batch_loss[3].1, history.loss[2] as f32);
    assert!(batch_loss.iter().all(|s| s.1.is_finite() && s.1 > 0.0));
    assert_eq!(scalars(&train, "batch_accuracy").len(), 4);

    // Histograms after epochs 1 and 3 (steps 0 and 2): every weight, every value counted.
    let weights = model.named_weights();
    let final_weights: Vec<Vec<f32>> = weights.iter().map(|(_, t)| t.to_vec().unwrap()).collect();
    let histograms: Vec<&Event> = train
        .iter()
        .filter(|e| matches!(e, Event::Histogram { .. }))
        .collect();
    assert_eq!(histograms.len(), 2 * weights.len());
    for e in histograms {
        let Event::Histogram {
            step,
            tag,
            num,
            min,
            max,
            counted,
        } = e
        else {
            unreachable!()
        };
        let i = weights
            .iter()
            .position(|(n, _)| format!("{n}/histogram") == *tag)
            .unwrap_or_else(|| panic!("unknown tag {tag}"));
        assert_eq!(*num as usize, final_weights[i].len(), "{tag}");
        assert_eq!(counted, num, "{tag}: every value in one bucket");
        assert!(min <= max);
        if *step == 2 {
            let lo = final_weights[i].iter().copied().fold(f32::MAX, f32::min);
            let hi = final_weights[i].iter().copied().fold(f32::MIN, f32::max);
            assert_eq!(
                (*min as f32, *max as f32),
                (lo, hi),
                "{tag} after the last epoch"
            );
        } else {
            assert_eq!(*step, 0);
        }
    }

    let validation = events(&validation_file);
    assert_eq!(
        scalars(&validation, "epoch_loss"),
        per_epoch(&history.val_loss)
    );
    assert_eq!(
        scalars(&validation, "epoch_accuracy"),
        per_epoch(&history.val_accuracy)
    );
    assert_eq!(validation.len(), 1 + 2 * 3, "only the epoch scalars");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn by_default_only_epochs_are_logged_and_each_fit_starts_a_new_file() {
    let dir = scratch("defaults");
    let mut tensorboard = TensorBoard::new(&dir);
    let (_, first) = train(&mut tensorboard);
    let first_file = tensorboard.train_file().unwrap().to_path_buf();
    let (_, _) = train(&mut tensorboard);
    let second_file = tensorboard.train_file().unwrap().to_path_buf();
    assert_ne!(first_file, second_file, "a second fit writes a new file");
    let train = events(&first_file);
    assert_eq!(scalars(&train, "epoch_loss"), per_epoch(&first.loss));
    assert!(scalars(&train, "batch_loss").is_empty());
    assert!(!train.iter().any(|e| matches!(e, Event::Histogram { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_run_continues_the_step_numbers() {
    let dir = scratch("resume");
    let backup_dir = scratch("resume-backup");
    let setup = || {
        let _cpu = anygpu::with_device("/cpu:0").unwrap();
        let mut model = Sequential::with_seed(5);
        model
            .add(
                Dense::new(2)
                    .activation(Activation::Softmax)
                    .input_shape(&[2]),
            )
            .unwrap();
        model
            .compile(
                Loss::sparse_categorical_crossentropy(),
                Adam::default(),
                &[],
            )
            .unwrap();
        model.set_verbose(Verbosity::Silent);
        let data =
            Dataset::from_tensor_slices(vec![0.5, 0.1, 0.2, 0.9, 0.3, 0.3], &[2], vec![0, 1, 0])
                .unwrap()
                .batch(1, false);
        (model, data)
    };
    // Two of three epochs (3 steps each), checkpointed; then the rest in a new fit.
    let (mut first, data) = setup();
    let mut backup = BackupAndRestore::new(&backup_dir).delete_checkpoint(false);
    let mut tensorboard = TensorBoard::new(&dir).update_freq(1);
    first
        .fit_with_callbacks(&data, 2, None, None, &mut [&mut backup, &mut tensorboard])
        .unwrap();
    let (mut resumed, data) = setup();
    let mut backup = BackupAndRestore::new(&backup_dir);
    let mut tensorboard = TensorBoard::new(&dir).update_freq(1);
    let history = resumed
        .fit_with_callbacks(&data, 3, None, None, &mut [&mut backup, &mut tensorboard])
        .unwrap();
    assert_eq!(backup.restored_epochs(), Some(2));
    let events = events(tensorboard.train_file().unwrap());
    let steps: Vec<i64> = scalars(&events, "batch_loss").iter().map(|s| s.0).collect();
    assert_eq!(
        steps,
        [7, 8, 9],
        "the third epoch's steps, numbered after the first six"
    );
    assert_eq!(
        scalars(&events, "epoch_loss"),
        [(2, history.loss[2] as f32)]
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&backup_dir);
}

#[test]
fn the_decoder_rejects_a_corrupted_record() {
    // The checks above mean something only if a damaged file fails them.
    let dir = scratch("corrupt");
    let mut tensorboard = TensorBoard::new(&dir);
    train(&mut tensorboard);
    let mut bytes = std::fs::read(tensorboard.train_file().unwrap()).unwrap();
    assert!(records(&bytes).is_ok());
    let last = bytes.len() - 6;
    bytes[last] ^= 1;
    assert!(records(&bytes).unwrap_err().contains("bad data CRC"));
    bytes[8] ^= 1;
    assert!(records(&bytes)
        .unwrap_err()
        .contains("record 0: bad length CRC"));
    let _ = std::fs::remove_dir_all(&dir);
}
