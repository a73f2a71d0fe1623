//! `wpctl unwatch`: remove a watchpoint and report its final hit count (RemoveWatchpoint).

use clap::Args;
use serde_json::json;
use wpd_proto::v1::RemoveWatchpointRequest;

use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output;

/// `wpctl unwatch`.
#[derive(Debug, Args)]
pub struct UnwatchArgs {
    /// Watchpoint to remove
    #[arg(
        value_name = "ID",
        required_unless_present = "id",
        conflicts_with = "id"
    )]
    pub id_pos: Option<u64>,
    /// Watchpoint to remove (same as the positional ID)
    #[arg(long = "id", value_name = "ID")]
    pub id: Option<u64>,
}

impl UnwatchArgs {
    /// The id, given either way.
    pub fn id(&self) -> u64 {
        self.id
            .or(self.id_pos)
            .expect("clap requires --id or a positional ID")
    }
}

/// Runs `wpctl unwatch`: prints
/// `removed watchpoint 7 (write 8 bytes at 0x55d0c0a01040 in pid 123): 42 hits`, or for a
/// policy `removed policy 4 (write state.level) and its instances`.
pub async fn run(ctx: &Ctx, args: &UnwatchArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Asks the daemon and renders its answer.
pub async fn report(ctx: &Ctx, args: &UnwatchArgs) -> Result<Report, Error> {
    let id = args.id();
    let resp = ctx
        .unary(RemoveWatchpointRequest { id }, |mut c, r| async move {
            c.remove_watchpoint(r).await
        })
        .await?;
    let wp = resp.watchpoint.unwrap_or_default();
    if wp.policy_id == id {
        // A policy: the daemon answers with its spec; its instances went with it.
        let what = output::policy_what(&wpd_proto::v1::Policy {
            spec: wp.spec.clone(),
            ..Default::default()
        });
        let text = format!("removed policy {id} ({what}) and its instances");
        let mut v = output::watchpoint_json(&wp);
        v["id"] = json!(id);
        return Ok(Report::new(text, json!({ "policy": v })));
    }
    let mut v = output::watchpoint_json(&wp);
    v["id"] = json!(id);
    if wp.pending {
        let spec = wp.spec.clone().unwrap_or_default();
        let code = spec.code_event.unwrap_or_default();
        let text = format!(
            "removed pending {} {id} ({} in pid {}): its module was never loaded",
            if code.stop { "breakpoint" } else { "watch" },
            output::code_at(&code),
            spec.pid
        );
        return Ok(Report::new(text, json!({ "watchpoint": v })));
    }
    if let Some(p) = &wp.breakpoint {
        let pid = wp.spec.as_ref().map_or(0, |s| s.pid);
        let mut text = format!(
            "removed breakpoint {id} ({} in pid {pid}): {}",
            output::place_text(p),
            output::plural(wp.hits, "hit")
        );
        if wp.hits > 0 {
            text.push_str(&format!(
                "; a thread it still holds runs on after wpctl resume --pid {pid}"
            ));
        }
        return Ok(Report::new(text, json!({ "watchpoint": v })));
    }
    let text = format!(
        "removed watchpoint {id} ({}): {}",
        output::describe(&wp),
        output::plural(wp.hits, "hit")
    );
    Ok(Report::new(text, json!({ "watchpoint": v })))
}

#[cfg(test)]
mod tests {
    use crate::{Command, parse};

    #[test]
    fn unwatch_takes_id_either_way() {
        fn id(args: &[&str]) -> Result<u64, clap::Error> {
            match parse(args)?.command {
                Command::Unwatch(u) => Ok(u.id()),
                other => panic!("parsed as {other:?}"),
            }
        }
        assert_eq!(id(&["unwatch", "7"]).unwrap(), 7);
        assert_eq!(id(&["unwatch", "--id", "8"]).unwrap(), 8);
        assert!(id(&["unwatch"]).is_err());
        assert!(id(&["unwatch", "7", "--id", "8"]).is_err());
    }
}
