//! The deployment files in `deploy/` against the tools that judge them: `systemd-analyze verify`
//! on the units, socket activation end to end with `systemd-socket-activate` and a notify
//! socket of the test's own (READY=1, watchdog pings, a gRPC call on the passed socket,
//! STOPPING=1 and a clean exit at SIGTERM), and `kubernetes-validate --strict` on the DaemonSet.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::time::Instant;
use wpd_tests::{Target, TempDir, bin_path, peer_program, require_peer};

/// The repository's `deploy/` directory.
pub(crate) fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `systemd-analyze verify` on `units` (paths), its messages forced to stderr: (exit success,
/// what it printed). With `man`, the manual pages the units' `Documentation=` names are looked
/// up with man(1) in that MANPATH (as the README installs them); without, not looked up.
fn verify(analyze: &Path, units: &[PathBuf], man: Option<&Path>) -> Result<(bool, String)> {
    verify_as(analyze, units, man, None)
}

/// [`verify`], for a user's units (`--user`, with `runtime` as the user's runtime directory)
/// when `runtime` is given.
fn verify_as(
    analyze: &Path,
    units: &[PathBuf],
    man: Option<&Path>,
    runtime: Option<&Path>,
) -> Result<(bool, String)> {
    let mut cmd = Command::new(analyze);
    cmd.arg("verify");
    if let Some(rt) = runtime {
        cmd.arg("--user").env("XDG_RUNTIME_DIR", rt);
    }
    match man {
        Some(dir) => {
            cmd.arg("--man=yes").env("MANPATH", dir);
        }
        None => {
            cmd.arg("--man=no");
        }
    }
    let out = cmd
        .args(units)
        .env("SYSTEMD_LOG_TARGET", "console")
        .env("SYSTEMD_LOG_COLOR", "0")
        .stdin(Stdio::null())
        .output()
        .context("running systemd-analyze verify")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

/// The user's units (`deploy/user/`, for `systemctl --user`), copied with `ExecStart=`
/// pointing at the `wpd` this build made, pass `systemd-analyze verify --user` without a word;
/// a misspelt key does not; and they listen where a user's `wpd` and `wpctl` look.
#[test]
fn systemd_user_units_verify() -> Result<()> {
    let analyze = peer_program("systemd-analyze", "Debian: systemd");
    let dir = TempDir::new("wpd-user-units")?;
    let runtime = dir.join("run");
    std::fs::create_dir_all(&runtime)?;
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700))?;
    let user = deploy_dir().join("user");
    let service = std::fs::read_to_string(user.join("wpd.service"))?;
    let socket = std::fs::read_to_string(user.join("wpd.socket"))?;
    ensure!(
        service.contains("ExecStart=%h/.cargo/bin/wpd --listen unix:%t/wpd/wpd.sock ")
            && socket.contains("ListenStream=%t/wpd/wpd.sock\n"),
        "the user's units no longer listen on %t/wpd/wpd.sock: update this test"
    );
    // Where a user's wpd listens with no flags, and wpctl looks.
    ensure!(
        wpd_proto::user_socket(1000, Some(Path::new("/run/user/1000")))
            == Path::new("/run/user/1000/wpd/wpd.sock"),
        "the units and the daemon's default disagree"
    );
    let service = service.replace(
        "ExecStart=%h/.cargo/bin/wpd ",
        &format!("ExecStart={} ", bin_path("wpd").display()),
    );
    std::fs::write(dir.join("wpd.service"), &service)?;
    std::fs::write(dir.join("wpd.socket"), &socket)?;
    let units = [dir.join("wpd.socket"), dir.join("wpd.service")];
    let (ok, text) = verify_as(&analyze, &units, None, Some(&runtime))?;
    ensure!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify --user:\n{text}"
    );
    let bad = service.replace("NoNewPrivileges=yes", "NoNewPrivilegs=yes");
    ensure!(
        bad != service,
        "the user's wpd.service has no NoNewPrivileges=yes"
    );
    std::fs::write(dir.join("wpd.service"), bad)?;
    let (_, text) = verify_as(&analyze, &units, None, Some(&runtime))?;
    ensure!(
        text.contains("Unknown key") && text.contains("NoNewPrivilegs"),
        "a misspelt key went unnoticed:\n{text}"
    );
    Ok(())
}

/// The units, copied with `ExecStart=` pointing at the `wpd` this build made (verify needs an
/// executable there), pass `systemd-analyze verify` without a word; a misspelt key does not.
#[test]
fn systemd_units_verify() -> Result<()> {
    let analyze = peer_program("systemd-analyze", "Debian: systemd");
    let dir = TempDir::new("wpd-units")?;
    let wpd = bin_path("wpd");
    let service = std::fs::read_to_string(deploy_dir().join("wpd.service"))?;
    ensure!(
        service.contains("ExecStart=/usr/local/bin/wpd "),
        "wpd.service no longer starts /usr/local/bin/wpd: update this test"
    );
    let service = service.replace(
        "ExecStart=/usr/local/bin/wpd ",
        &format!("ExecStart={} ", wpd.display()),
    );
    std::fs::write(dir.join("wpd.service"), &service)?;
    std::fs::copy(deploy_dir().join("wpd.socket"), dir.join("wpd.socket"))?;
    let units = [dir.join("wpd.socket"), dir.join("wpd.service")];
    // The manual pages the units name, installed as the README says: wpd(8), wpctl(1).
    let man = dir.join("man");
    for (section, page, bin, args) in [
        ("man8", "wpd.8", "wpd", ["--man"]),
        ("man1", "wpctl.1", "wpctl", ["man"]),
    ] {
        std::fs::create_dir_all(man.join(section))?;
        let out = Command::new(bin_path(bin)).args(args).output()?;
        ensure!(
            out.status.success() && out.stdout.starts_with(b".ie"),
            "{bin} {args:?} printed no manual page: {out:?}"
        );
        std::fs::write(man.join(section).join(page), &out.stdout)?;
    }
    let (ok, text) = verify(&analyze, &units, Some(&man))?;
    ensure!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify:\n{text}"
    );
    // And the lookup is real: without the pages, verify says what is missing.
    let empty = dir.join("no-man");
    std::fs::create_dir_all(&empty)?;
    let (_, text) = verify(&analyze, &units, Some(&empty))?;
    ensure!(
        text.contains("wpd(8)") || text.contains("man wpd"),
        "missing manual pages went unnoticed:\n{text}"
    );

    // The check really reads the keys: a misspelt one is reported.
    let bad = service.replace("NoNewPrivileges=yes", "NoNewPrivilegs=yes");
    ensure!(bad != service, "wpd.service has no NoNewPrivileges=yes");
    std::fs::write(dir.join("wpd.service"), bad)?;
    let (_, text) = verify(&analyze, &units, None)?;
    ensure!(
        text.contains("Unknown key") && text.contains("NoNewPrivilegs"),
        "a misspelt key went unnoticed:\n{text}"
    );
    Ok(())
}

/// Capabilities named in `wpd.service` (`CapabilityBoundingSet=`), without `CAP_`.
pub(crate) fn unit_capabilities() -> Result<BTreeSet<String>> {
    let unit = std::fs::read_to_string(deploy_dir().join("wpd.service"))?;
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .ok_or_else(|| anyhow!("wpd.service has no CapabilityBoundingSet="))?;
    Ok(line
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect())
}

/// Capabilities the DaemonSet adds (the list under `add:`).
fn daemonset_capabilities() -> Result<BTreeSet<String>> {
    let yaml = std::fs::read_to_string(deploy_dir().join("kubernetes/daemonset.yaml"))?;
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "add:").skip(1);
    let mut caps = BTreeSet::new();
    for l in lines.by_ref() {
        let t = l.trim();
        if t.starts_with('#') {
            continue;
        }
        match t.strip_prefix("- ") {
            Some(c) => caps.insert(c.to_string()),
            None => break,
        };
    }
    ensure!(!caps.is_empty(), "no capabilities added in daemonset.yaml");
    Ok(caps)
}

/// The systemd unit and the DaemonSet grant the same capabilities, but for SYS_RESOURCE, which
/// only the pod needs (systemd sets the limits with LimitNOFILE=).
#[test]
fn unit_and_daemonset_grant_the_same_capabilities() -> Result<()> {
    let unit = unit_capabilities()?;
    let mut pod = daemonset_capabilities()?;
    ensure!(
        pod.remove("SYS_RESOURCE"),
        "the DaemonSet lacks SYS_RESOURCE"
    );
    ensure!(
        unit == pod,
        "wpd.service grants {unit:?}, the DaemonSet {pod:?}"
    );
    Ok(())
}

/// `kubernetes-validate --strict` accepts the DaemonSet, and rejects copies with a misspelt
/// field, at the top of the pod spec and deep in a container's security context.
#[test]
fn kubernetes_daemonset_validates() -> Result<()> {
    let validate = |path: &Path| -> Result<(bool, String)> {
        let out = Command::new("python3")
            .args(["-m", "kubernetes_validate", "--strict"])
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .context("running python3 -m kubernetes_validate")?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        ))
    };
    let available = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require_peer(
        available,
        "kubernetes-validate",
        "PyPI: kubernetes-validate",
    );
    let path = deploy_dir().join("kubernetes/daemonset.yaml");
    let (ok, text) = validate(&path)?;
    ensure!(
        ok,
        "kubernetes-validate --strict refused daemonset.yaml:\n{text}"
    );

    let yaml = std::fs::read_to_string(&path)?;
    let dir = TempDir::new("wpd-k8s")?;
    for (right, wrong) in [
        ("hostPID: true", "hostPid: true"),
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFileSystem: true",
        ),
    ] {
        ensure!(yaml.contains(right), "daemonset.yaml has no {right:?}");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, yaml.replace(right, wrong))?;
        let (ok, text) = validate(&bad)?;
        let field = wrong.split(':').next().unwrap_or(wrong);
        ensure!(
            !ok && text.contains(field),
            "kubernetes-validate --strict accepted {wrong:?}:\n{text}"
        );
    }
    Ok(())
}

/// What systemd's notify socket received, one state per line (`READY=1`, `WATCHDOG=1`…).
struct NotifySocket {
    socket: tokio::net::UnixDatagram,
    seen: Vec<String>,
}

impl NotifySocket {
    fn bind(path: &Path) -> Result<NotifySocket> {
        Ok(NotifySocket {
            socket: tokio::net::UnixDatagram::bind(path)
                .with_context(|| format!("binding {}", path.display()))?,
            seen: Vec::new(),
        })
    }

    /// Waits up to `timeout` until `state` has been received `times` times in all.
    async fn wait_for(&mut self, state: &str, times: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 4096];
        while self.seen.iter().filter(|s| *s == state).count() < times {
            let n = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf))
                .await
                .map_err(|_| {
                    anyhow!(
                        "{state} not received {times} times within {timeout:?}; received {:?}",
                        self.seen
                    )
                })??;
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.seen
                .extend(msg.lines().filter(|l| !l.is_empty()).map(str::to_string));
        }
        Ok(())
    }
}

/// `systemd-socket-activate` running `wpd`: dropping it kills the process (by then `wpd`) and
/// prints its log when the test failed.
struct Activated {
    child: Child,
    log: PathBuf,
    exited: bool,
}

impl Activated {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("----- wpd log -----\n{}\n-----", self.log());
        }
    }
}

/// Socket activation as systemd does it: `systemd-socket-activate` binds the socket (in a mode
/// other than the 0660 wpd gives its own), waits for a first connection and execs `wpd`
/// with `LISTEN_FDS`. That first connection, a gRPC health check, is answered on the passed
/// socket; `READY=1` and watchdog pings reach the test's notify socket; SIGTERM brings
/// `STOPPING=1` and exit status 0; the socket's path and mode are systemd's throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_end_to_end() -> Result<()> {
    let activate = peer_program("systemd-socket-activate", "Debian: systemd");
    let dir = TempDir::new("wpd-activate")?;
    let socket = dir.join("wpd.sock");
    let not_ours = dir.join("not-used.sock");
    let mut notify = NotifySocket::bind(&dir.join("notify.sock"))?;
    let log = dir.join("wpd.log");
    let log_file = std::fs::File::create(&log)?;
    let env = [
        format!("NOTIFY_SOCKET={}", dir.join("notify.sock").display()),
        "WATCHDOG_USEC=400000".to_string(),
        format!("WPD_STATE_FILE={}", dir.join("ptrace-armed").display()),
        format!("WPD_STATE_DIR={}", dir.join("state").display()),
        "NO_COLOR=1".to_string(),
    ];
    let mut cmd = Command::new(&activate);
    cmd.arg("-l").arg(&socket);
    for e in &env {
        cmd.arg("-E").arg(e);
    }
    // The --listen path differs from the passed socket's: the passed one must win.
    cmd.arg(bin_path("wpd"))
        .arg("--listen")
        .arg(format!("unix:{}", not_ours.display()))
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        // SAFETY: prctl is async-signal-safe; this runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut wpd = Activated {
        child: cmd.spawn().context("starting systemd-socket-activate")?,
        log,
        exited: false,
    };
    let result = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            ensure!(
                Instant::now() < deadline,
                "systemd-socket-activate did not create {}",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mode =
            |p: &Path| -> Result<u32> { Ok(std::fs::metadata(p)?.permissions().mode() & 0o777) };
        // wpd gives its own sockets 0660: another mode shows that it left this one alone.
        let before = mode(&socket)?;
        ensure!(before != 0o660, "the passed socket is 0660 already");

        // The first connection makes systemd-socket-activate exec wpd, which must answer it.
        let check = tokio::spawn({
            let target = Target::Unix(socket.clone());
            async move {
                let channel = wpd_proto::connect::channel(&target).await?;
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                let r = health
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: "wpd.v1.Watchpoints".into(),
                    })
                    .await?
                    .into_inner();
                anyhow::Ok(r.status())
            }
        });
        notify
            .wait_for("READY=1", 1, Duration::from_secs(20))
            .await?;
        let status = tokio::time::timeout(Duration::from_secs(20), check)
            .await
            .map_err(|_| anyhow!("the health check over the passed socket timed out"))???;
        ensure!(
            status == tonic_health::pb::health_check_response::ServingStatus::Serving,
            "health: {status:?}"
        );
        // WATCHDOG_USEC=0.4 s: a ping every 0.2 s.
        notify
            .wait_for("WATCHDOG=1", 3, Duration::from_secs(5))
            .await?;
        ensure!(
            wpd.log().contains("(socket from systemd)"),
            "wpd did not say it serves the passed socket:\n{}",
            wpd.log()
        );
        ensure!(!not_ours.exists(), "wpd bound its --listen path as well");
        ensure!(
            mode(&socket)? == before,
            "wpd changed the passed socket's mode from {before:o} to {:o}",
            mode(&socket)?
        );

        // SAFETY: kill on our own child, not reaped yet.
        unsafe { libc::kill(wpd.child.id() as libc::pid_t, libc::SIGTERM) };
        notify
            .wait_for("STOPPING=1", 1, Duration::from_secs(10))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = wpd.child.try_wait()? {
                wpd.exited = true;
                break st;
            }
            if Instant::now() >= deadline {
                bail!("wpd did not exit within 20 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        ensure!(status.success(), "wpd exited with {status}");
        ensure!(socket.exists(), "wpd removed the socket systemd owns");
        ensure!(
            notify.seen.iter().position(|s| s == "READY=1")
                < notify.seen.iter().position(|s| s == "STOPPING=1"),
            "READY=1 must come before STOPPING=1: {:?}",
            notify.seen
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("----- wpd log -----\n{}\n-----", wpd.log());
    }
    result
}
