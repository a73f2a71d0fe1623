//! `wpctl attach`: start tracking every thread of a process (Attach).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::{AttachRequest, AttachResponse};

use crate::args::{BackendArg, backend_value, pid_parser};
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Process to attach to
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// How to program the debug registers (default: the daemon's default)
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Allow pid 1 (the init process, whose stop or death takes the system with it)
    #[arg(long)]
    pub allow_init: bool,
}

/// Runs `wpctl attach`.
pub async fn run(ctx: &Ctx, args: &AttachArgs) -> Result<(), Error> {
    let request = AttachRequest {
        pid: args.pid,
        backend: backend_value(args.backend),
        allow_init: args.allow_init,
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.attach(r).await })
        .await?;
    if ctx.json {
        output::emit_json(&to_json(args.pid, &resp))
    } else {
        output::emit(&to_text(args.pid, &resp))
    }
}

fn to_json(pid: i32, resp: &AttachResponse) -> serde_json::Value {
    let mut v = match &resp.process {
        Some(p) => output::process_json(p),
        None => json!({ "pid": pid }),
    };
    v["newly_attached"] = json!(resp.newly_attached);
    v
}

/// `attached pid 123 (perf): 1001 threads`, or
/// `pid 123 already attached (perf): 1001 threads, 2 watchpoints`.
fn to_text(pid: i32, resp: &AttachResponse) -> String {
    let p = resp.process.clone().unwrap_or_default();
    let pid = if p.pid != 0 { p.pid } else { pid };
    let backend = output::backend_name(p.backend);
    let threads = output::plural(p.threads, "thread");
    if resp.newly_attached {
        format!("attached pid {pid} ({backend}): {threads}")
    } else {
        format!(
            "pid {pid} already attached ({backend}): {threads}, {}",
            output::plural(p.watchpoints, "watchpoint")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1::{Backend, ProcessInfo};

    #[test]
    fn renders() {
        let mut resp = AttachResponse {
            process: Some(ProcessInfo {
                pid: 123,
                backend: Backend::Perf as i32,
                threads: 1001,
                watchpoints: 2,
                comm: "demo".into(),
                attached_at_ns: 1,
                stops: String::new(),
            }),
            newly_attached: true,
        };
        assert_eq!(to_text(123, &resp), "attached pid 123 (perf): 1001 threads");
        assert_eq!(to_json(123, &resp)["backend"], "perf");
        resp.newly_attached = false;
        assert_eq!(
            to_text(123, &resp),
            "pid 123 already attached (perf): 1001 threads, 2 watchpoints"
        );
        assert_eq!(to_json(123, &resp)["newly_attached"], false);
    }
}
