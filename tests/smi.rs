//! `anygpu-smi` and the publishing behind it: a live process's devices and memory are seen and
//! agree with `get_memory_info`; a killed process's file is cleaned; an unsafe directory is
//! refused; damaged files never crash the tool; `--json` parses.
//!
//! Every test publishes into its own directory (`ANYGPU_SMI_DIR`), so tests running at the same
//! time, and other programs, never meet. Waits for the publisher (four snapshots a second) are
//! bounded polls, not timed assertions.

#![cfg(unix)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anygpu::smi::{self, Scan};
use anygpu::{Runtime, Tensor};

/// Set in a child process: the directory it publishes into, and what it does then.
const CHILD_DIR: &str = "ANYGPU_SMI_TEST_CHILD_DIR";
const CHILD_EXIT: &str = "ANYGPU_SMI_TEST_CHILD_EXIT";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anygpu-smi-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn private_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn runtime_publishing_to(dir: &Path) -> Runtime {
    common::builder()
        .env("ANYGPU_SMI", None)
        .env("ANYGPU_SMI_DIR", Some(dir.to_str().unwrap()))
        .build()
        .expect("a runtime builds")
}

/// Polls `scan(dir)` until `done` holds (at most 20 s: the publisher writes every 250 ms).
fn wait_for(dir: &Path, what: &str, done: impl Fn(&Scan) -> bool) -> Scan {
    let start = Instant::now();
    loop {
        let scan = smi::scan(dir).unwrap();
        if done(&scan) {
            return scan;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waited 20 s for {what}; last scan: {scan:?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn smi_tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anygpu-smi"))
        .args(args)
        .env("WGPU_BACKEND", common::backends())
        .output()
        .expect("anygpu-smi runs")
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "anygpu-smi failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json output does not parse ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn smi_sees_a_live_process_and_agrees_with_get_memory_info() {
    let dir = scratch("live");
    let rt = runtime_publishing_to(&dir);
    let gpus = rt.list_logical_devices("GPU").unwrap();
    let gpu = gpus.first().filter(|g| g.backend().is_some());
    // 2 MiB on the GPU, half made by an op there (so the device's op count moves too).
    let _held = gpu.map(|g| {
        let _on = g.scope();
        let zeros = Tensor::zeros_on(&[1024, 256], anygpu::DType::F32, g).expect("1 MiB");
        let sum = zeros.add(&zeros).expect("an op on the GPU");
        (zeros, sum) // both kept: nothing is freed while the numbers are compared
    });
    let me = std::process::id();

    // Once the publisher has caught up, its numbers are get_memory_info's (nothing else runs).
    let info = gpu.map(|g| rt.get_memory_info(g.name()).unwrap());
    let scan = wait_for(&dir, "this process's snapshot", |s| {
        s.processes.iter().any(|p| {
            p.pid == me
                && match (gpu, info) {
                    (Some(g), Some(info)) => p
                        .devices
                        .iter()
                        .any(|d| d.name == g.name() && d.in_use == Some(info.current)),
                    _ => !p.devices.is_empty(),
                }
        })
    });
    let mine = scan.processes.iter().find(|p| p.pid == me).unwrap();
    let names: Vec<&str> = mine.devices.iter().map(|d| d.name.as_str()).collect();
    let expected: Vec<String> = rt
        .list_logical_devices(None::<anygpu::DeviceKind>)
        .unwrap()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, expected, "every logical device, in order");

    // The tool, at this moment, shows the same as get_memory_info.
    let out = smi_tool(&[
        "--json",
        "--dir",
        dir.to_str().unwrap(),
        "--pid",
        &me.to_string(),
    ]);
    let json = json_of(&out);
    let processes = json["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "--pid keeps this process: {json}");
    assert_eq!(processes[0]["pid"], me);
    if let (Some(g), Some(info)) = (gpu, info) {
        let stats = rt.get_memory_stats(g.name()).unwrap();
        let d = processes[0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == g.name())
            .unwrap();
        assert_eq!(d["in_use"], info.current, "{d}");
        assert_eq!(d["peak"], info.peak, "{d}");
        assert_eq!(d["reserved"], stats.bytes_reserved, "{d}");
        assert!(info.current >= 1 << 20, "the tensor is counted");
        // Ops per logical device: the add ran on this GPU (no op has run since).
        assert_eq!(d["ops"], g.ops_run(), "{d}");
        assert!(g.ops_run() >= 1, "{d}");
    } else {
        eprintln!("(no GPU: only the CPU device was checked)");
    }
    // The physical table lists the CPU and every adapter.
    let physical = rt.list_physical_devices(None::<anygpu::DeviceKind>).len();
    assert_eq!(
        json["devices"].as_array().unwrap().len(),
        physical,
        "{json}"
    );
    let other = smi_tool(&["--json", "--dir", dir.to_str().unwrap(), "--pid", "1"]);
    assert!(json_of(&other)["processes"].as_array().unwrap().is_empty());

    // A dropped runtime takes its file with it.
    drop(_held);
    drop(rt);
    wait_for(&dir, "the dropped runtime's file to go", |s| {
        !s.processes.iter().any(|p| p.pid == me)
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Not a test of its own: the process the tests below start, kill or let exit. Publishes
/// into `$ANYGPU_SMI_TEST_CHILD_DIR`, then waits to be killed, or exits normally once its file
/// exists when `$ANYGPU_SMI_TEST_CHILD_EXIT` is set.
#[test]
fn child_publishes_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let rt = runtime_publishing_to(&dir);
    let me = std::process::id();
    wait_for(&dir, "the child's own file", |s| {
        s.processes.iter().any(|p| p.pid == me)
    });
    if std::env::var_os(CHILD_EXIT).is_some() {
        // exit() without dropping the runtime: the at-exit hook must remove the file.
        std::mem::forget(rt);
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_secs(120));
    drop(rt);
}

fn start_child(dir: &Path, exit: bool) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_publishes_until_killed",
        "--test-threads",
        "1",
    ])
    .env(CHILD_DIR, dir)
    .stdout(std::process::Stdio::null());
    if exit {
        cmd.env(CHILD_EXIT, "1");
    }
    cmd.spawn().expect("the test binary starts again")
}

#[test]
fn a_killed_processs_file_is_ignored_and_cleaned() {
    let dir = private_dir("killed");
    let mut child = start_child(&dir, false);
    let pid = child.id();
    wait_for(&dir, "the child's snapshot", |s| {
        s.processes.iter().any(|p| p.pid == pid)
    });
    let file = dir.join(format!("{pid}-0.smi"));
    assert!(file.exists());
    child.kill().unwrap(); // SIGKILL: no exit hook runs
    child.wait().unwrap();
    assert!(file.exists(), "a killed process leaves its file");

    let json = json_of(&smi_tool(&["--json", "--dir", dir.to_str().unwrap()]));
    assert!(
        !json["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid),
        "a dead process is not listed: {json}"
    );
    let notes = json["notes"].to_string();
    assert!(
        notes.contains(&format!("process {pid} has ended; removed")),
        "{notes}"
    );
    assert!(!file.exists(), "the dead process's file is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_that_exits_removes_its_file() {
    let dir = private_dir("exits");
    let mut child = start_child(&dir, true);
    let pid = child.id();
    let status = child.wait().unwrap();
    assert!(status.success(), "the child exits normally");
    assert!(
        !dir.join(format!("{pid}-0.smi")).exists(),
        "the exit hook removed the file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unsafe_directory_is_refused_by_the_publisher_and_the_tool() {
    let dir = private_dir("open");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let rt = runtime_publishing_to(&dir);
    rt.initialize().unwrap();
    // The refusal happens before the publisher thread would start: nothing can appear later.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let out = smi_tool(&["--dir", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("writable by others (mode 777)"), "{err}");
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn anygpu_smi_0_turns_publishing_off() {
    let dir = scratch("off");
    let rt = common::builder()
        .env("ANYGPU_SMI", Some("0"))
        .env("ANYGPU_SMI_DIR", Some(dir.to_str().unwrap()))
        .build()
        .unwrap();
    rt.initialize().unwrap();
    assert!(!dir.exists(), "not even the directory is created");
}

#[test]
fn damaged_and_foreign_files_are_skipped_with_a_note() {
    let dir = private_dir("damaged");
    let me = std::process::id();
    let good = smi::Snapshot {
        pid: me,
        program: "test".into(),
        updated: 1.8e9,
        ..smi::Snapshot::default()
    }
    .to_text();
    std::fs::write(dir.join(format!("{me}-0.smi")), &good[..good.len() / 2]).unwrap();
    std::fs::write(dir.join(format!("{me}-1.smi")), [0xff, 0xfe, 0x00, 0x13]).unwrap();
    let huge = std::fs::File::create(dir.join(format!("{me}-2.smi"))).unwrap();
    huge.set_len(8 << 30).unwrap(); // sparse: 8 GiB that take no disk
    std::fs::write(
        dir.join(format!("{me}-3.smi")),
        good.replace(&format!("pid {me}"), "pid 1"),
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "hello").unwrap();
    std::fs::write(dir.join(format!("{me}-4.smi")), &good).unwrap();

    let json = json_of(&smi_tool(&["--json", "--dir", dir.to_str().unwrap()]));
    let processes = json["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "only the good file: {json}");
    let notes: Vec<String> = json["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    let note = |file: &str| notes.iter().find(|n| n.starts_with(file)).cloned();
    assert!(
        note(&format!("{me}-0.smi"))
            .is_some_and(|n| n.contains("no valid 'updated'") || n.contains("line")),
        "{notes:?}"
    );
    assert!(
        note(&format!("{me}-1.smi")).is_some_and(|n| n.contains("not UTF-8")),
        "{notes:?}"
    );
    assert!(
        note(&format!("{me}-2.smi")).is_some_and(|n| n.contains("larger than")),
        "{notes:?}"
    );
    assert!(
        note(&format!("{me}-3.smi")).is_some_and(|n| n.contains("says pid 1")),
        "{notes:?}"
    );
    assert!(
        note("notes.txt").is_some_and(|n| n.contains("not an anygpu-smi file")),
        "{notes:?}"
    );

    // The table shows the same, notes included, and succeeds.
    let table = smi_tool(&["--dir", dir.to_str().unwrap()]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("note: notes.txt"), "{text}");
    assert!(text.contains(&format!("{me} test")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_prints_one_line_per_gpu() {
    let out = smi_tool(&["-L"]);
    assert!(out.status.success());
    let gpus = common::builder()
        .configure()
        .unwrap()
        .list_physical_devices("GPU")
        .len();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), gpus, "{text}");
    assert!(text.lines().all(|l| l.starts_with("GPU ")), "{text}");
}

/// This process's start time in clock ticks after boot, as Linux's `/proc/self/stat` gives it.
fn own_start_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[test]
fn a_file_whose_pid_now_runs_another_process_is_removed() {
    let Some(started) = own_start_ticks() else {
        eprintln!("SKIPPED: no /proc, so no start times to compare");
        return;
    };
    let dir = private_dir("reused");
    let me = std::process::id();
    let snapshot = |started: u64| {
        smi::Snapshot {
            pid: me,
            started: Some(started),
            program: "test".into(),
            updated: 1.8e9,
            ..smi::Snapshot::default()
        }
        .to_text()
    };
    // Our PID, written by a process that started earlier: a dead writer whose PID was reused.
    let stale = dir.join(format!("{me}-0.smi"));
    std::fs::write(&stale, snapshot(started.saturating_sub(1))).unwrap();
    let ours = dir.join(format!("{me}-1.smi"));
    std::fs::write(&ours, snapshot(started)).unwrap();
    let scan = smi::scan(&dir).unwrap();
    assert_eq!(scan.processes.len(), 1, "{scan:?}");
    assert_eq!(scan.processes[0].started, Some(started));
    assert!(
        scan.notes
            .contains(&format!("{me}-0.smi: process {me} has ended; removed")),
        "{:?}",
        scan.notes
    );
    assert!(!stale.exists() && ours.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn control_characters_from_a_snapshot_are_stripped_in_the_table_and_escaped_in_json() {
    let dir = private_dir("control");
    let me = std::process::id();
    // Written by hand: `Snapshot::to_text` would have replaced them; another writer need not.
    let program = "ev\x1b[2Jil\x07\r\u{7f}\u{9b}31m!";
    let device = "/device:\x1b]0;owned\x07GPU:0";
    std::fs::write(
        dir.join(format!("{me}-0.smi")),
        format!(
            "anygpu-smi 1\npid {me}\nprogram {program}\nupdated 1.8e9\n\
             device {device}\tad\x1bapter\tVulkan\t-\t-\t-\t-\t-\n"
        ),
    )
    .unwrap();
    // A file name makes a note; notes are printed too.
    std::fs::write(dir.join("bell\x07\x1b[1A.txt"), "").unwrap();
    let shown_raw = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .chars()
            .find(|&c| c != '\n' && c.is_control())
    };

    let table = smi_tool(&["--dir", dir.to_str().unwrap()]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(shown_raw(&table.stdout), None, "{text:?}");
    assert!(text.contains("ev[2Jil31m!"), "{text}");
    assert!(text.contains("/device:]0;ownedGPU:0"), "{text}");
    assert!(text.contains("note: bell[1A.txt"), "{text}");

    let out = smi_tool(&["--json", "--dir", dir.to_str().unwrap()]);
    assert_eq!(
        shown_raw(&out.stdout),
        None,
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Escaped, not stripped: a parser gets the string as published.
    let json = json_of(&out);
    assert_eq!(json["processes"][0]["program"], program, "{json}");
    assert_eq!(json["processes"][0]["devices"][0]["name"], device, "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn watch_refuses_intervals_it_cannot_sleep() {
    let dir = private_dir("watch");
    for bad in ["1e20", "NaN", "inf", "-1", "0", "86401", "soon"] {
        let out = smi_tool(&["--watch", bad, "--dir", dir.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--watch {bad}: {err}");
        assert!(
            err.contains(&format!(
                "--watch '{bad}': expected seconds, more than 0 and at most 86400"
            )),
            "--watch {bad}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
