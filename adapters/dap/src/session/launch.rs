//! `launch`: the session starts the program itself, held before its first
//! instruction (`crate::launch`), attaches the daemon to it and lets it run
//! at `configurationDone`, once the client's data breakpoints are armed;
//! with `stopOnEntry` it is held there by the daemon instead, shown as a
//! stop with reason `entry`. Its output becomes `output` events, its exit
//! an `exited` event with its code, then `terminated`; the session's end
//! kills it.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use wpd_proto::v1 as pb;

use super::attach::modes;
use super::{Handler, Input, Launched, Session, StopMode};
use crate::error::DapError;
use crate::launch::{self, ExitSink, OutputSink, Program};
use crate::protocol::events::{Exited, Initialized, Stopped, Terminated};
use crate::protocol::requests::*;

impl Handler<Launch> for Session {
    async fn handle(&mut self, a: LaunchArguments) -> Result<(), DapError> {
        if self.pid.is_some() || self.launched.is_some() {
            return Err(DapError::AlreadyAttached);
        }
        let (backend, mode) = modes(a.backend.as_deref(), a.stop_on_hit.as_deref())?;
        if a.stop_on_entry && mode == StopMode::Never {
            return Err(DapError::PerfNeverStops);
        }
        if a.program.trim().is_empty() {
            return Err(DapError::BadArguments(
                "launch needs \"program\": the executable to start".into(),
            ));
        }
        let program = Program {
            program: a.program,
            args: a.args,
            env: environment(a.env)?,
            cwd: a.cwd.filter(|c| !c.is_empty()).map(Into::into),
        };
        let pid = if self.terminal {
            self.start_in_terminal(program).await?
        } else {
            self.start_captured(program).await?
        };
        self.launched = Some(Launched {
            pid,
            stop_on_entry: a.stop_on_entry,
            running: false,
            exited: false,
        });
        if let Err(e) = self.attach_to(pid, backend, mode, "launch").await {
            // Nothing of it may stay behind: it never ran.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            self.launched = None;
            return Err(e);
        }
        self.event_after_response(&Initialized {});
        Ok(())
    }
}

impl Session {
    /// Starts `program` held, its output captured as `output` events.
    async fn start_captured(&mut self, program: Program) -> Result<i32, DapError> {
        let tx = self.inputs.clone();
        let output: OutputSink = Box::new(move |category, text| {
            let _ = tx.blocking_send(Input::Output(category, text));
        });
        let tx = self.inputs.clone();
        let exited: ExitSink = Box::new(move |code| {
            let _ = tx.blocking_send(Input::Exited(code));
        });
        launch::start(program, output, exited)
            .await
            .map_err(|e| DapError::Launch(e.to_string()))
    }

    /// Starts `program` held in the client's terminal: a `runInTerminal`
    /// reverse request runs `wpctl dap --launch-helper SOCKET -- PROGRAM
    /// ARGS...` there ([`launch::terminal_helper`]), which reports the
    /// program's pid, then its exit code, on a socket of this session (in
    /// a directory of mode 0700, served to the adapter's own uid only).
    async fn start_in_terminal(&mut self, p: Program) -> Result<i32, DapError> {
        use std::os::unix::fs::DirBuilderExt as _;
        use tokio::io::AsyncBufReadExt as _;
        let fail = |why: String| DapError::Launch(format!("cannot start {:?}: {why}", p.program));
        let dir = std::env::temp_dir().join(format!(
            "wpd-dap-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let sock = dir.join("launch.sock");
        let listener = tokio::net::UnixListener::bind(&sock);
        let exe = std::env::current_exe();
        let (listener, exe) = match (listener, exe) {
            (Ok(l), Ok(e)) => (l, e),
            (Err(e), _) | (_, Err(e)) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(fail(e.to_string()));
            }
        };
        let mut args = vec![
            exe.display().to_string(),
            "dap".into(),
            "--launch-helper".into(),
            sock.display().to_string(),
            "--".into(),
            p.program.clone(),
        ];
        args.extend(p.args.iter().cloned());
        let env: serde_json::Map<String, Value> = p
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
            .collect();
        let cwd = p
            .cwd
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .map(|c| c.display().to_string())
            .unwrap_or_else(|| "/".into());
        self.send(serde_json::json!({
            "type": "request",
            "command": "runInTerminal",
            "arguments": {
                "kind": "integrated",
                "title": p.program,
                "cwd": cwd,
                "args": args,
                "env": env,
            }
        }));
        let accepted = tokio::time::timeout(TERMINAL_TIMEOUT, listener.accept()).await;
        let _ = std::fs::remove_dir_all(&dir);
        let stream = match accepted {
            Ok(Ok((s, _))) => s,
            Ok(Err(e)) => return Err(fail(e.to_string())),
            Err(_) => {
                return Err(fail(format!(
                    "the client's terminal did not start it within {} s",
                    TERMINAL_TIMEOUT.as_secs()
                )));
            }
        };
        let me = nix::unistd::geteuid().as_raw();
        match stream.peer_cred() {
            Ok(c) if c.uid() == me => {}
            Ok(c) => {
                return Err(fail(format!(
                    "the helper runs as uid {}, not {me}",
                    c.uid()
                )));
            }
            Err(e) => return Err(fail(e.to_string())),
        }
        let mut lines = tokio::io::BufReader::new(stream).lines();
        let first = tokio::time::timeout(TERMINAL_TIMEOUT, lines.next_line()).await;
        let pid = match first {
            Ok(Ok(Some(l))) => match l.split_once(' ') {
                Some(("pid", n)) => n.trim().parse::<i32>().map_err(|e| fail(e.to_string()))?,
                Some(("error", why)) => return Err(DapError::Launch(why.to_string())),
                _ => return Err(fail(format!("the helper said {l:?}"))),
            },
            Ok(Ok(None)) => return Err(fail("the helper ended without a word".into())),
            Ok(Err(e)) => return Err(fail(e.to_string())),
            Err(_) => return Err(fail("the helper said nothing".into())),
        };
        let tx = self.inputs.clone();
        tokio::spawn(async move {
            // `exit CODE`; a helper gone without it (its terminal closed)
            // took the program with it (its death signal).
            let code = match lines.next_line().await {
                Ok(Some(l)) => l
                    .strip_prefix("exit ")
                    .and_then(|c| c.trim().parse().ok())
                    .unwrap_or(-1),
                _ => 128 + libc::SIGKILL,
            };
            let _ = tx.send(Input::Exited(code)).await;
        });
        Ok(pid)
    }
}

/// How long the client's terminal may take to start the helper.
const TERMINAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `env` as an object (`null` removes a variable) or `NAME=VALUE` strings.
fn environment(
    env: Option<Value>,
) -> Result<std::collections::HashMap<String, Option<String>>, DapError> {
    let bad = || {
        DapError::BadArguments(
            "\"env\": an object of strings (null removes a variable) or an array of \
             \"NAME=VALUE\" strings"
                .into(),
        )
    };
    let mut out = std::collections::HashMap::new();
    match env {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let v = match v {
                    Value::Null => None,
                    Value::String(s) => Some(s),
                    Value::Number(n) => Some(n.to_string()),
                    Value::Bool(b) => Some(b.to_string()),
                    _ => return Err(bad()),
                };
                out.insert(k, v);
            }
        }
        Some(Value::Array(a)) => {
            for v in a {
                let Value::String(s) = v else {
                    return Err(bad());
                };
                let Some((k, v)) = s.split_once('=') else {
                    return Err(bad());
                };
                out.insert(k.to_string(), Some(v.to_string()));
            }
        }
        Some(_) => return Err(bad()),
    }
    if out
        .keys()
        .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(bad());
    }
    Ok(out)
}

impl Session {
    /// At `configurationDone`: a launched program runs (its breakpoints are
    /// armed by now), or is held at its entry by the daemon and shown so.
    pub(super) async fn run_launched(&mut self) -> Result<(), DapError> {
        let Some(l) = self.launched.as_mut().filter(|l| !l.running) else {
            return Ok(());
        };
        l.running = true;
        let Launched {
            pid, stop_on_entry, ..
        } = *l;
        if stop_on_entry {
            // Held by the daemon (released with the lease) before SIGCONT
            // ends its group-stop.
            self.client()
                .pause(self.daemon.request(pb::PauseRequest {
                    pid,
                    tids: vec![],
                    lease: self.lease,
                }))
                .await?;
        }
        kill(Pid::from_raw(pid), Signal::SIGCONT)
            .map_err(|e| DapError::Launch(format!("cannot start process {pid}: {e}")))?;
        if stop_on_entry {
            self.stopped = true;
            self.event_after_response(&Stopped {
                reason: "entry",
                description: Some("before the program's first instruction".into()),
                thread_id: i64::from(pid),
                all_threads_stopped: true,
                ..Default::default()
            });
        }
        Ok(())
    }

    /// The launched program exited: `exited` with its code, `terminated`.
    pub(super) fn program_exited(&mut self, code: i32) {
        let Some(l) = self.launched.as_mut().filter(|l| !l.exited) else {
            return;
        };
        l.exited = true;
        self.armed.clear();
        self.pid = None;
        self.forget_stop(None);
        self.send_event(&Exited { exit_code: code });
        self.send_event(&Terminated {});
    }

    /// Kills the launched program unless it has exited (the end of the
    /// session).
    pub(super) fn kill_launched(&mut self) {
        if let Some(l) = self.launched.take().filter(|l| !l.exited) {
            let _ = kill(Pid::from_raw(l.pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_an_object_or_name_value_strings() {
        let e = environment(Some(serde_json::json!({"A": "1", "B": null, "C": 3}))).unwrap();
        assert_eq!(e["A"].as_deref(), Some("1"));
        assert_eq!(e["B"], None);
        assert_eq!(e["C"].as_deref(), Some("3"));
        let e = environment(Some(serde_json::json!(["A=1=2", "B="]))).unwrap();
        assert_eq!(e["A"].as_deref(), Some("1=2"));
        assert_eq!(e["B"].as_deref(), Some(""));
        for bad in [
            serde_json::json!(["A"]),
            serde_json::json!({"A": [1]}),
            serde_json::json!({"": "x"}),
            serde_json::json!(7),
        ] {
            assert!(environment(Some(bad.clone())).is_err(), "{bad}");
        }
    }
}
