//! `PidNamespace`: a pid namespace the test makes, below its own, to run clients and targets in.

use crate::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

/// A new pid namespace (and mount namespace, with its own `/proc`), nested in the test's:
/// `unshare --pid --fork --mount-proc --kill-child sleep`, whose `sleep` is its pid 1 and holds
/// it. Processes run in it with `nsenter --target <init>`. Dropping it kills `unshare`, and so
/// its `sleep` and with it every process of the namespace.
pub struct PidNamespace {
    child: Child,
    status: Option<ExitStatus>,
    /// The namespace's first process (its pid 1) as the test's namespace numbers it.
    pub init: i32,
    /// The cgroup its cgroup namespace is rooted at, when it has one of its own.
    cgroup: Option<std::path::PathBuf>,
}

impl PidNamespace {
    /// A new pid namespace.
    pub async fn start() -> Result<PidNamespace> {
        Self::spawn(None).await
    }

    /// A new pid namespace with a cgroup namespace of its own, rooted at cgroup v2 directory
    /// `cgroup` (the namespace's first process is moved there before it is made).
    pub async fn start_in_cgroup(cgroup: &Path) -> Result<PidNamespace> {
        Self::spawn(Some(cgroup)).await
    }

    async fn spawn(cgroup: Option<&Path>) -> Result<PidNamespace> {
        let unshare = "unshare --pid --fork --mount-proc --kill-child";
        let mut cmd = match cgroup {
            None => {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
                c.args(["sleep", "1000000"]);
                c
            }
            Some(cg) => {
                // Into the cgroup first: a cgroup namespace is rooted where its maker is.
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!(
                    "echo $$ > '{}/cgroup.procs' && exec {unshare} --cgroup sleep 1000000",
                    cg.display()
                ));
                c
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        guard_child(&mut cmd);
        let child = cmd.spawn().context("cannot start unshare")?;
        let mut ns = PidNamespace {
            child,
            status: None,
            init: 0,
            cgroup: cgroup.map(Path::to_path_buf),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let me = ns.child.id();
        loop {
            // Its `sleep`: the namespace's pid 1, `NSpid: <here> 1`.
            let init = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<i32>().ok());
            if let Some(init) = init
                && let Some(nspid) = nspid(init, init)
                && nspid.len() == 2
                && nspid[1] == 1
                && std::fs::read_to_string(format!("/proc/{init}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            {
                ns.init = init;
                return Ok(ns);
            }
            if let Ok(Some(st)) = ns.child.try_wait() {
                ns.status = Some(st);
                bail!("unshare exited: {st}");
            }
            if std::time::Instant::now() > deadline {
                bail!("no pid namespace made by unshare (pid {me}) within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `nsenter` into the namespace (its pid and mount namespaces), running `program`. With a
    /// cgroup namespace of its own, the program joins that namespace and moves into its root
    /// cgroup first, as a process started in a container is there (`setns` alone leaves a
    /// process in its cgroup, outside the namespace's root).
    fn nsenter(&self, program: &Path) -> tokio::process::Command {
        let mut cmd = match &self.cgroup {
            None => tokio::process::Command::new("nsenter"),
            Some(cg) => {
                let mut c = tokio::process::Command::new("sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#)
                    .arg("sh")
                    .arg(cg)
                    .arg("nsenter");
                c
            }
        };
        cmd.arg("--target")
            .arg(self.init.to_string())
            .args(["--pid", "--mount"]);
        if self.cgroup.is_some() {
            cmd.arg("--cgroup");
        }
        cmd.arg("--").arg(program);
        cmd
    }

    /// Runs `wpctl` with `args` in the namespace; kills it and fails after `timeout`.
    pub async fn wpctl(&self, args: &[&str], timeout: Duration) -> Result<CmdOutput> {
        let mut cmd = self.nsenter(&bin_path("wpctl"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(timeout, cmd.output())
            .await
            .map_err(|_| {
                anyhow!(
                    "`wpctl {}` in the namespace did not finish within {timeout:?}",
                    args.join(" ")
                )
            })?
            .context("running nsenter")?;
        Ok(CmdOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// The tids of process `pid` as the namespace numbers them (its own `/proc`).
    pub fn tids(&self, pid: i32) -> Result<Vec<i32>> {
        let dir = format!("/proc/{}/root/proc/{pid}/task", self.init);
        let mut v: Vec<i32> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {dir}"))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        v.sort_unstable();
        Ok(v)
    }
}

/// `NSpid` of thread `tid` of `pid`, as the test's `/proc` shows it: its number here first,
/// then in each namespace below down to its own.
pub fn nspid(pid: i32, tid: i32) -> Option<Vec<i32>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect()
}

/// The threads of process `pid` (the test's number), each by its number in the namespace one
/// level below the test's → its number here.
pub fn threads_below(pid: i32) -> Result<BTreeMap<i32, i32>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = e?.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(ns) = nspid(pid, tid)
            && ns.len() >= 2
        {
            m.insert(ns[1], ns[0]);
        }
    }
    Ok(m)
}

impl Drop for PidNamespace {
    fn drop(&mut self) {
        stop_child_blocking(&mut self.child, &mut self.status, false);
        // The namespace ends with its pid 1, which `--kill-child` killed with unshare.
        for _ in 0..250 {
            if self.init == 0 || !Path::new(&format!("/proc/{}", self.init)).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
