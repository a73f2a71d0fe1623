//! `wpctl caps`: what the host and daemon support (GetCapabilities).

use serde_json::json;
use wpd_proto::v1::{GetCapabilitiesRequest, GetCapabilitiesResponse};

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output::{self, Table};
use wpd_proto::text::escape;

/// Runs `wpctl caps`.
pub async fn run(ctx: &Ctx) -> Result<(), Error> {
    report(ctx).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx) -> Result<Report, Error> {
    let caps = ctx
        .unary(GetCapabilitiesRequest {}, |mut c, r| async move {
            c.get_capabilities(r).await
        })
        .await?;
    Ok(Report::new(to_text(&caps), to_json(&caps)))
}

fn to_json(c: &GetCapabilitiesResponse) -> serde_json::Value {
    json!({
        "arch": c.arch,
        "slots_per_thread": c.slots_per_thread,
        "lengths": c.lengths,
        "access_kinds": c.access_kinds.iter().map(|&a| output::access_name(a)).collect::<Vec<_>>(),
        "max_user_address": output::hex(c.max_user_address),
        "backends": c.backends.iter().map(|b| json!({
            "backend": output::backend_name(b.backend),
            "usable": b.usable,
            "reason": b.reason,
            "default": b.is_default,
            "stops": b.stops,
            "events": b.events,
            "code_events": b.code_events,
            "new_processes": b.new_processes,
        })).collect::<Vec<_>>(),
        "cpus": c.cpus,
        "kernel": c.kernel,
        "version": c.version,
    })
}

fn to_text(c: &GetCapabilitiesResponse) -> String {
    let join = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    let mut text = output::key_values(&[
        ("arch", escape(&c.arch).into_owned()),
        ("slots", format!("{} per thread", c.slots_per_thread)),
        (
            "lengths",
            join(c.lengths.iter().map(u32::to_string).collect()),
        ),
        (
            "access",
            join(
                c.access_kinds
                    .iter()
                    .map(|&a| output::access_name(a))
                    .collect(),
            ),
        ),
        ("max address", output::hex(c.max_user_address)),
        ("cpus", c.cpus.to_string()),
        ("kernel", escape(&c.kernel).into_owned()),
        ("version", escape(&c.version).into_owned()),
    ]);
    text.push_str("\nbackends:\n");
    let mut table = Table::new(["  BACKEND", "USABLE", "DEFAULT", "STOPS", "REASON"]);
    for b in &c.backends {
        table.row(vec![
            format!("  {}", output::backend_name(b.backend)),
            if b.usable { "yes" } else { "no" }.into(),
            if b.is_default { "yes" } else { "" }.into(),
            output::name_or_dash(&b.stops),
            output::name_or_dash(&b.reason),
        ]);
    }
    text.push_str(&table.render());
    for b in c.backends.iter().filter(|b| !b.events.is_empty()) {
        text.push_str(&format!(
            "{} events: {}\n",
            output::backend_name(b.backend),
            escape(&b.events)
        ));
    }
    for b in c.backends.iter().filter(|b| !b.code_events.is_empty()) {
        text.push_str(&format!(
            "{} code events: {}\n",
            output::backend_name(b.backend),
            escape(&b.code_events)
        ));
    }
    for b in c
        .backends
        .iter()
        .filter(|b| b.usable && !b.new_processes.is_empty())
    {
        text.push_str(&format!(
            "{} policies' new processes: {}\n",
            output::backend_name(b.backend),
            escape(&b.new_processes)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{Access, Backend, BackendInfo};

    #[test]
    fn renders_text_and_json() {
        let caps = GetCapabilitiesResponse {
            arch: "x86_64".into(),
            slots_per_thread: 4,
            lengths: vec![1, 2, 4, 8],
            access_kinds: vec![
                Access::Write as i32,
                Access::ReadWrite as i32,
                Access::Exec as i32,
            ],
            max_user_address: 0x7fff_ffff_f000,
            backends: vec![
                BackendInfo {
                    backend: Backend::Perf as i32,
                    usable: true,
                    reason: String::new(),
                    is_default: true,
                    stops: String::new(),
                    events: "per-thread (one breakpoint event per thread and slot)".into(),
                    code_events: String::new(),
                    new_processes: "held at exec".into(),
                },
                BackendInfo {
                    backend: Backend::Ptrace as i32,
                    usable: false,
                    reason: "ptrace_scope is 3".into(),
                    is_default: false,
                    stops: "signal".into(),
                    events: String::new(),
                    code_events: "uprobe + BPF signal stop".into(),
                    new_processes: String::new(),
                },
            ],
            version: "0.1.0".into(),
            cpus: 8,
            kernel: "6.8.0".into(),
        };
        let text = to_text(&caps);
        assert!(text.contains("slots:       4 per thread\n"), "{text}");
        assert!(text.contains("access:      write, rw, exec\n"), "{text}");
        assert!(text.contains("  ptrace   no      "), "{text}");
        assert!(text.contains("ptrace_scope is 3"), "{text}");
        assert!(text.contains(" signal "), "{text}");
        assert!(
            text.contains("perf events: per-thread (one breakpoint event per thread and slot)\n"),
            "{text}"
        );
        assert!(!text.contains("ptrace events"), "{text}");
        assert!(
            text.contains("perf policies' new processes: held at exec\n"),
            "{text}"
        );
        assert!(!text.contains("ptrace policies'"), "{text}");
        let v = to_json(&caps);
        assert_eq!(v["backends"][1]["stops"], "signal");
        assert_eq!(
            v["backends"][0]["events"].as_str().map(|s| &s[..10]),
            Some("per-thread")
        );
        assert_eq!(v["access_kinds"], json!(["write", "rw", "exec"]));
        assert_eq!(v["max_user_address"], "0x7ffffffff000");
        assert_eq!(v["backends"][0]["backend"], "perf");
        assert_eq!(v["backends"][0]["default"], true);
    }
}
