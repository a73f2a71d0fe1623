//! Runs the `wpctl` binary against scripted in-process daemons (`mock`, and
//! `hostile`, which does not play fair) and against no daemon at all,
//! checking output formats and exit codes. The tests are grouped by area:
//! `unary`, `events`, `fleet` (several endpoints), `hostile`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod events;
mod fleet;
mod hostile;
mod mock;
mod unary;

use mock::EventStream;

/// A fresh temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wpctl-test-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn socket(&self) -> PathBuf {
        self.0.join("wpd.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn wpctl(endpoint: &str, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpctl"))
        .args(args)
        .env("WPD_ENDPOINT", endpoint)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("wpctl did not finish")
        .unwrap();
    Run {
        code: out.status.code().expect("exited normally"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// An endpoints file in `dir` with these lines.
fn endpoints_file(dir: &TempDir, lines: &[String]) -> String {
    let path = dir.0.join("fleet");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn no_daemon_is_a_transport_error_with_exit_3() {
    let dir = TempDir::new("none");
    let endpoint = format!("unix:{}", dir.socket().display());
    let r = wpctl(&endpoint, &["caps"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: cannot reach wpd at {endpoint}: ")),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("`wpd`"), "{}", r.stderr);

    let r = wpctl(&endpoint, &["caps", "--json"]).await;
    assert_eq!(r.code, 3);
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["code"], "UNAVAILABLE");
    assert_eq!(v["error"]["exit_code"], 3);

    // `--access read` passes the parser (the daemon is the one to refuse it).
    let r = wpctl(
        &endpoint,
        &["watch", "--pid", "1", "--addr", "4096", "--access", "read"],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let r = wpctl(
        "unix:/nonexistent",
        &["watch", "--pid", "1", "--addr", "0xzz"],
    )
    .await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("is not a hex number"), "{}", r.stderr);
    let r = wpctl("unix:/nonexistent", &["frobnicate"]).await;
    assert_eq!(r.code, 2);
}
