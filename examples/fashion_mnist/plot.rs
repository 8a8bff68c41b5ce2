//! The learning curves: loss and accuracy per epoch, train and validation, as a PNG drawn in
//! memory and written whole (`anygpu::nn::write_atomically`), so a killed run never leaves
//! half a picture.

use std::path::Path;

use anygpu::nn::History;
use image::codecs::png::PngEncoder;
use image::{ColorType, ImageEncoder};
use plotters::prelude::*;
use plotters::style::FontStyle;

const TRAIN: RGBColor = RGBColor(31, 119, 180);
const VALID: RGBColor = RGBColor(255, 127, 14);

/// The chart's size in pixels: two 600 × 480 panels.
const SIZE: (u32, u32) = (1200, 480);

/// Registers a sans-serif TTF found on this machine; `false` when there is none (the chart
/// is then drawn without text).
fn register_font() -> bool {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/System/Library/Fonts/Supplemental/Arial.ttf",
        "/Library/Fonts/Arial.ttf",
        "C:\\Windows\\Fonts\\arial.ttf",
    ];
    for path in candidates {
        if let Ok(bytes) = std::fs::read(path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

fn range(series: &[&[f64]], floor_zero: bool) -> (f64, f64) {
    let values = series
        .iter()
        .flat_map(|s| s.iter().copied())
        .filter(|v| v.is_finite());
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.1).max(1e-3);
    let lo = if floor_zero {
        (lo - pad).max(0.0)
    } else {
        lo - pad
    };
    (lo, hi + pad)
}

/// Writes the learning curves of `h` to `path` (PNG), replacing it whole or not at all.
pub fn learning_curves(path: &Path, h: &History) -> Result<(), String> {
    let png = png(h)?;
    anygpu::nn::write_atomically(path, &png).map_err(|e| e.to_string())
}

/// The chart as PNG bytes.
pub fn png(h: &History) -> Result<Vec<u8>, String> {
    let (width, height) = SIZE;
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    draw(&mut rgb, h)?;
    let mut png = Vec::new();
    PngEncoder::new(&mut png)
        .write_image(&rgb, width, height, ColorType::Rgb8)
        .map_err(|e| e.to_string())?;
    Ok(png)
}

/// Draws the two panels into `rgb`, an RGB buffer of [`SIZE`].
fn draw(rgb: &mut [u8], h: &History) -> Result<(), String> {
    let text = register_font();
    let root = BitMapBackend::with_buffer(rgb, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(600);
    let epochs = h.epochs().max(2) as f64;
    let panels = [
        (left, "loss", [&h.loss[..], &h.val_loss[..]]),
        (right, "accuracy", [&h.accuracy[..], &h.val_accuracy[..]]),
    ];
    for (area, title, [train, valid]) in panels {
        let (lo, hi) = range(&[train, valid], true);
        let mut builder = ChartBuilder::on(&area);
        builder.margin(20);
        if text {
            builder
                .caption(title, ("sans-serif", 24))
                .x_label_area_size(40)
                .y_label_area_size(55);
        }
        let mut chart = builder
            .build_cartesian_2d(1.0..epochs, lo..hi)
            .map_err(|e| e.to_string())?;
        if text {
            let whole_epochs = |x: &f64| format!("{x:.0}");
            chart
                .configure_mesh()
                .x_labels(h.epochs().clamp(2, 12))
                .x_label_formatter(&whole_epochs)
                .x_desc("epoch")
                .y_desc(title)
                .draw()
                .map_err(|e| e.to_string())?;
        } else {
            chart
                .plotting_area()
                .draw(&Rectangle::new(
                    [(1.0, lo), (epochs, hi)],
                    BLACK.stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
        }
        for (series, color, label) in [(train, TRAIN, "train"), (valid, VALID, "validation")] {
            if series.is_empty() {
                continue;
            }
            let points: Vec<(f64, f64)> = series
                .iter()
                .enumerate()
                .map(|(i, &v)| ((i + 1) as f64, v))
                .collect();
            let drawn = chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?;
            if text {
                drawn.label(label).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_is_a_png_of_its_size() {
        let h = History {
            loss: vec![0.7, 0.5],
            val_loss: vec![0.6, 0.55],
            accuracy: vec![0.75, 0.8],
            val_accuracy: vec![0.78, 0.81],
            ..History::default()
        };
        let png = png(&h).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // The IHDR chunk: width and height, big-endian.
        assert_eq!(&png[16..24], &[0, 0, 4, 176, 0, 0, 1, 224]);
    }
}
