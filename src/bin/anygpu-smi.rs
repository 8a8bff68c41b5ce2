//! `anygpu-smi`: our `nvidia-smi`, over every adapter wgpu finds and every running anygpu
//! process's logical devices and memory.
//!
//! ```text
//! anygpu-smi [-L] [--json] [--watch SECONDS] [--pid PID] [--dir DIR]
//!
//!   (none)           the physical devices, then the processes using anygpu
//!   -L               one line per physical device (nvidia-smi -L)
//!   --json           the same as JSON
//!   --watch SECONDS  redraw every SECONDS, up to 86400 (watch -n 0.1 nvidia-smi)
//!   --pid PID        only this process
//!   --dir DIR        where processes publish (default: anygpu::smi::default_dir())
//! ```

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anygpu::smi::{self, DeviceUse, Scan, Snapshot};
use anygpu::{format_bytes, DeviceKind, Runtime};
use serde_json::{json, Value};

const USAGE: &str = "usage: anygpu-smi [-L] [--json] [--watch SECONDS] [--pid PID] [--dir DIR]";

#[derive(Debug, Default)]
struct Args {
    list: bool,
    json: bool,
    watch: Option<Duration>,
    pid: Option<u32>,
    dir: Option<PathBuf>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match a.as_str() {
            "-L" | "--list-gpus" => args.list = true,
            "--json" => args.json = true,
            "--watch" | "-l" => {
                let v = value(&a)?;
                args.watch = Some(watch_interval(&v)?);
            }
            "--pid" => {
                let v = value(&a)?;
                args.pid = Some(v.parse().map_err(|_| format!("--pid '{v}': not a PID"))?);
            }
            "--dir" => args.dir = Some(PathBuf::from(value(&a)?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    Ok(args)
}

/// The longest `--watch` interval: a day (longer would be a typo, and `Duration` has limits).
const MAX_WATCH_SECONDS: f64 = 86_400.0;

/// `--watch`'s value: seconds, more than 0 and at most [`MAX_WATCH_SECONDS`].
fn watch_interval(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= MAX_WATCH_SECONDS)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or(format!(
            "--watch '{v}': expected seconds, more than 0 and at most {MAX_WATCH_SECONDS} (a day)"
        ))
}

/// A physical device as listed: index, adapter, backend, type, memory.
struct Physical {
    name: String,
    adapter: String,
    backend: String,
    kind: String,
    memory: Option<u64>,
}

fn physical_devices() -> Vec<Physical> {
    // Listing never initializes a runtime: this process publishes nothing.
    let rt = Runtime::new();
    rt.list_physical_devices(None::<DeviceKind>)
        .iter()
        .map(|pd| {
            let details = rt.get_device_details(pd).ok();
            let gpu = details.as_ref().and_then(|d| d.gpu.as_ref());
            Physical {
                name: pd.name().to_string(),
                adapter: details
                    .as_ref()
                    .map_or_else(|| "?".into(), |d| d.device_name.clone()),
                backend: details
                    .as_ref()
                    .map_or_else(|| "?".into(), |d| d.backend.clone()),
                kind: gpu.map_or_else(|| "host".into(), |g| g.adapter_type.clone()),
                memory: gpu.and_then(|g| g.memory_bytes),
            }
        })
        .collect()
}

/// `s` without control characters: a snapshot's strings are written by other processes, and
/// an ESC, CR or BEL in them would drive the terminal (move the cursor, retitle the window,
/// hide lines) instead of being shown.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).collect()
}

fn bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), format_bytes)
}

fn last_step(s: &Snapshot) -> String {
    match (s.step_seconds, s.steps) {
        (Some(t), Some(n)) => format!("{:.1} ms (step {n})", t * 1e3),
        (Some(t), None) => format!("{:.1} ms", t * 1e3),
        _ => "-".into(),
    }
}

fn table(physical: &[Physical], scan: &Scan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:<40} {:<8} {:<14} {:>10}",
        "Device", "Adapter", "Backend", "Type", "Memory"
    );
    for p in physical {
        let _ = writeln!(
            out,
            "{:<28} {:<40} {:<8} {:<14} {:>10}",
            printable(&p.name),
            printable(&p.adapter),
            printable(&p.backend),
            printable(&p.kind),
            bytes(p.memory)
        );
    }
    if let Ok(v) = std::env::var("ANYGPU_VISIBLE_DEVICES") {
        let _ = writeln!(
            out,
            "(ANYGPU_VISIBLE_DEVICES={}: only these GPUs are listed)",
            printable(&v)
        );
    }
    let _ = writeln!(out, "\nProcesses:");
    let _ = writeln!(
        out,
        "{:>8} {:<20} {:<16} {:>11} {:>11} {:>11} {:>10}  Last step",
        "PID", "Program", "Device", "Reserved", "In use", "Peak", "Ops"
    );
    if scan.processes.is_empty() {
        let _ = writeln!(out, "{:>8} (no running process uses anygpu)", "");
    }
    let no_device = [DeviceUse {
        name: "-".into(),
        ..DeviceUse::default()
    }];
    for s in &scan.processes {
        // A process is listed even before it has a device.
        let devices = match s.devices.is_empty() {
            true => &no_device[..],
            false => &s.devices[..],
        };
        for (i, d) in devices.iter().enumerate() {
            let (pid, program, step) = match i {
                0 => (s.pid.to_string(), printable(&s.program), last_step(s)),
                _ => (String::new(), String::new(), String::new()),
            };
            let _ = writeln!(
                out,
                "{pid:>8} {program:<20} {:<16} {:>11} {:>11} {:>11} {:>10}  {step}",
                printable(&d.name),
                bytes(d.reserved),
                bytes(d.in_use),
                bytes(d.peak),
                d.ops.map_or_else(|| "-".into(), |k| k.to_string())
            );
        }
    }
    for note in &scan.notes {
        let _ = writeln!(out, "note: {}", printable(note));
    }
    out
}

fn list(physical: &[Physical]) -> String {
    let mut out = String::new();
    for p in physical.iter().filter(|p| p.kind != "host") {
        let index = p.name.rsplit(':').next().unwrap_or("?");
        let _ = writeln!(
            out,
            "GPU {index}: {} ({}, {})",
            printable(&p.adapter),
            printable(&p.backend),
            printable(&p.kind)
        );
    }
    out
}

/// JSON escapes for what a terminal would obey: serde_json escapes U+0000..U+001F as RFC 8259
/// requires; DEL and the C1 controls (U+0080..U+009F, CSI among them) are escaped here too, so
/// `--json` on a terminal cannot drive it either, while a parser still gets each string exactly
/// as published. Outside strings JSON text has no such characters, so escaping them is safe.
fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

fn json_device(d: &DeviceUse) -> Value {
    json!({
        "name": d.name,
        "adapter": d.adapter,
        "backend": d.backend,
        "reserved": d.reserved,
        "in_use": d.in_use,
        "peak": d.peak,
        "limit": d.limit,
        "ops": d.ops,
    })
}

fn json(physical: &[Physical], scan: &Scan) -> String {
    let devices: Vec<Value> = physical
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "adapter": p.adapter,
                "backend": p.backend,
                "type": p.kind,
                "memory": p.memory,
            })
        })
        .collect();
    let processes: Vec<Value> = scan
        .processes
        .iter()
        .map(|s| {
            json!({
                "pid": s.pid,
                "program": s.program,
                "updated": s.updated,
                "steps": s.steps,
                "step_seconds": s.step_seconds.filter(|t| t.is_finite()),
                "devices": s.devices.iter().map(json_device).collect::<Vec<_>>(),
            })
        })
        .collect();
    let doc = json!({ "devices": devices, "processes": processes, "notes": scan.notes });
    escape_controls(&doc.to_string()) + "\n"
}

fn render(args: &Args, physical: &[Physical], dir: &std::path::Path) -> Result<String, String> {
    if args.list {
        return Ok(list(physical));
    }
    let mut scan = smi::scan(dir).map_err(|e| e.to_string())?;
    if let Some(pid) = args.pid {
        scan.processes.retain(|s| s.pid == pid);
    }
    Ok(match args.json {
        true => json(physical, &scan),
        false => table(physical, &scan),
    })
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let dir = args.dir.clone().unwrap_or_else(smi::default_dir);
    let physical = physical_devices();
    loop {
        match render(&args, &physical, &dir) {
            Ok(text) => {
                // Home, clear: redraw in place, as `watch` does.
                let clear = if args.watch.is_some() {
                    "\x1b[H\x1b[2J"
                } else {
                    ""
                };
                let mut stdout = std::io::stdout().lock();
                let shown = write!(stdout, "{clear}{text}").and_then(|()| stdout.flush());
                if shown.is_err() {
                    // The reader went away (`anygpu-smi | head`): nothing left to do.
                    std::process::exit(0);
                }
            }
            Err(e) => {
                eprintln!("anygpu-smi: {e}");
                std::process::exit(1);
            }
        }
        match args.watch {
            Some(interval) => std::thread::sleep(interval),
            None => break,
        }
    }
}
