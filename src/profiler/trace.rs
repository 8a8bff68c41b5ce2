//! `trace.json` in the Chrome trace-event format (the "JSON Object Format" of the Trace Event
//! Format document), which Perfetto and `chrome://tracing` open.
//!
//! Process 1 is the host: one track per thread, holding the ops (their host time) and the
//! `Trace` spans. Each device with timed kernels is a process of its own with one track, its
//! stream. Times are microseconds since `start()`.

use std::collections::HashMap;
use std::fmt::Write;

use super::Session;

pub(crate) fn chrome_trace(s: &Session) -> String {
    let mut events: Vec<String> = Vec::new();
    let host_pid = 1;
    events.push(meta("process_name", host_pid, 0, "host"));
    let mut threads: Vec<u64> = s.ops.iter().map(|o| o.thread).collect();
    threads.extend(s.spans.iter().map(|sp| sp.thread));
    threads.extend(s.waits.iter().map(|w| w.thread));
    threads.sort_unstable();
    threads.dedup();
    for t in &threads {
        events.push(meta("thread_name", host_pid, *t, &format!("thread {t}")));
    }
    for sp in &s.spans {
        events.push(complete(
            &sp.name,
            "span",
            host_pid,
            sp.thread,
            sp.start_ns,
            sp.dur_ns,
            "{}".into(),
        ));
    }
    for w in &s.waits {
        events.push(complete(
            &format!("host wait: {}", w.cause),
            "wait",
            host_pid,
            w.thread,
            w.start_ns,
            w.dur_ns,
            format!("{{\"device\":{}}}", quote(&w.device)),
        ));
    }
    for o in &s.ops {
        let args = format!(
            "{{\"device\":{},\"bytes_allocated\":{},\"kernels\":{},\"device_ms\":{:.6},\"timing\":{}}}",
            quote(&o.device),
            o.bytes,
            o.kernels,
            o.device_ns as f64 / 1e6,
            quote(&format!("{:?}", o.timing))
        );
        events.push(complete(
            o.name, "op", host_pid, o.thread, o.start_ns, o.host_ns, args,
        ));
    }
    // One process per device, numbered after the host in order of name.
    let mut devices: Vec<&str> = s.kernels.iter().map(|k| k.device.as_str()).collect();
    devices.sort_unstable();
    devices.dedup();
    let op_names: HashMap<u64, &'static str> = s.ops.iter().map(|o| (o.id, o.name)).collect();
    for (i, d) in devices.iter().enumerate() {
        let pid = host_pid + 1 + i as u64;
        events.push(meta("process_name", pid, 0, d));
        events.push(meta("thread_name", pid, 1, "stream"));
        for k in s.kernels.iter().filter(|k| k.device == *d) {
            let op = k.op.and_then(|id| op_names.get(&id)).copied().unwrap_or("");
            events.push(complete(
                k.kernel,
                "kernel",
                pid,
                1,
                k.start_ns,
                k.dur_ns,
                format!("{{\"op\":{}}}", quote(op)),
            ));
        }
    }
    let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    out.push_str(&events.join(",\n"));
    out.push_str("\n]}\n");
    out
}

fn meta(what: &str, pid: u64, tid: u64, name: &str) -> String {
    format!(
        "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
        quote(name)
    )
}

fn complete(
    name: &str,
    cat: &str,
    pid: u64,
    tid: u64,
    start_ns: u64,
    dur_ns: u64,
    args: String,
) -> String {
    format!(
        "{{\"ph\":\"X\",\"name\":{},\"cat\":\"{cat}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{:.3},\"dur\":{:.3},\"args\":{args}}}",
        quote(name),
        start_ns as f64 / 1e3,
        dur_ns as f64 / 1e3
    )
}

/// A JSON string literal.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
