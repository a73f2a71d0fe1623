//! `wpctl resume`: let threads held stopped after a hit run again (Resume).

use serde_json::{Value, json};
use wpd_proto::v1::{ResumeRequest, ResumeResponse};

use crate::cmd::Ctx;
use crate::error::Error;
use crate::{ResumeArgs, output};

/// Runs `wpctl resume`. Resuming nothing is not an error (exit 0).
pub async fn run(ctx: &Ctx, args: &ResumeArgs) -> Result<(), Error> {
    let request = ResumeRequest {
        pid: args.pid,
        tids: args.tids.clone(),
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.resume(r).await })
        .await?;
    if ctx.json {
        output::emit_json(&to_json(&resp))
    } else {
        output::emit(&to_text(args, &resp))
    }
}

fn to_json(resp: &ResumeResponse) -> Value {
    json!({ "resumed": resp.resumed })
}

/// `resumed 3 threads: 101,102,103`, or `no held threads in pid 123` (with
/// `--tid`: `no held threads in pid 123 among tids 124,125`).
fn to_text(args: &ResumeArgs, resp: &ResumeResponse) -> String {
    if resp.resumed.is_empty() {
        let mut text = format!("no held threads in pid {}", args.pid);
        if !args.tids.is_empty() {
            text.push_str(&format!(" among tids {}", output::id_list(&args.tids)));
        }
        return text;
    }
    format!(
        "resumed {}: {}",
        output::plural(resp.resumed.len() as u64, "thread"),
        output::id_list(&resp.resumed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(tids: Vec<i32>) -> ResumeArgs {
        ResumeArgs { pid: 123, tids }
    }

    #[test]
    fn renders() {
        let resp = ResumeResponse {
            resumed: vec![101, 102, 103],
        };
        assert_eq!(
            to_text(&args(vec![]), &resp),
            "resumed 3 threads: 101,102,103"
        );
        assert_eq!(
            to_text(&args(vec![101]), &ResumeResponse { resumed: vec![101] }),
            "resumed 1 thread: 101"
        );
        assert_eq!(
            to_text(&args(vec![]), &ResumeResponse::default()),
            "no held threads in pid 123"
        );
        assert_eq!(
            to_text(&args(vec![124, 125]), &ResumeResponse::default()),
            "no held threads in pid 123 among tids 124,125"
        );
        assert_eq!(to_json(&resp), json!({ "resumed": [101, 102, 103] }));
        assert_eq!(
            to_json(&ResumeResponse::default()),
            json!({ "resumed": [] })
        );
    }
}
