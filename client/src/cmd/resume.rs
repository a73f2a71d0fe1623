//! `wpctl resume`: let threads held stopped after a hit run again (Resume).

use clap::Args;
use serde_json::{Value, json};
use wpd_proto::v1::{ResumeRequest, ResumeResponse};

use crate::args::pid_parser;
use crate::cmd::Ctx;
use crate::error::Error;
use crate::output;

/// `wpctl resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Process whose held threads to resume
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate); default: every held thread
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
}

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
    use crate::{Command, parse};

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

    #[test]
    fn resume_args() {
        fn resume(args: &[&str]) -> Result<ResumeArgs, clap::Error> {
            let mut all = vec!["resume"];
            all.extend_from_slice(args);
            match parse(&all)?.command {
                Command::Resume(r) => Ok(r),
                other => panic!("parsed as {other:?}"),
            }
        }
        let r = resume(&["--pid", "123"]).unwrap();
        assert_eq!((r.pid, r.tids), (123, vec![]));
        let r = resume(&["--pid", "123", "--tid", "124,125", "--tid", "126"]).unwrap();
        assert_eq!(r.tids, vec![124, 125, 126]);
        assert!(resume(&[]).is_err());
        assert!(resume(&["--pid", "0"]).is_err());
        assert!(resume(&["--pid", "1", "--tid", "-3"]).is_err());
    }
}
