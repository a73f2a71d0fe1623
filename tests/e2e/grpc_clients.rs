//! gRPC clients in other languages, on the daemon's Unix socket with their
//! default options: Python's `grpcio` (grpc-core, which sends the
//! percent-encoded socket path as `:authority`), the same made to send the
//! raw path (what grpc-java and grpc-swift send), and `grpclib` (a
//! pure-Python HTTP/2 implementation). Each does a health check, (grpcio)
//! lists the services by reflection, sets a watchpoint by name on a C
//! target the test started, receives symbolized hits from StreamEvents, and
//! gets a refusal as a typed status (`tests/py/wpd_client.py`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::{CTarget, Daemon, require_python_grpc, require_root_perf};

/// Runs the Python client with `implementation`; returns what it printed.
async fn python_client(
    daemon: &Daemon,
    target: &CTarget,
    implementation: &str,
) -> Result<serde_json::Value> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("wpd-py-{}-{implementation}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    let run = tokio::process::Command::new("python3")
        .arg(here.join("py/wpd_client.py"))
        .args(["--impl", implementation, "--socket"])
        .arg(daemon.socket_path())
        .arg("--proto-dir")
        .arg(here.join("../proto"))
        .arg("--out")
        .arg(&out)
        .args([
            "--pid",
            &target.pid.to_string(),
            "--symbol",
            "counter",
            "--hits",
            "5",
        ])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .context("the Python client took more than 120 s")??;
    let _ = std::fs::remove_dir_all(&out);
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "{implementation}: {}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim())
        .with_context(|| format!("{implementation} printed {stdout:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_clients_work_with_their_default_options() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    require_python_grpc();
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 1").await?;
    let result = async {
        for implementation in ["grpcio", "grpcio-path-authority", "grpclib"] {
            let seen = python_client(&daemon, &t, implementation).await?;
            let what = format!("{implementation}: {seen}");
            ensure!(seen["health"] == "SERVING", "{what}");
            if implementation != "grpclib" {
                let services = seen["services"].as_array().context("no services")?;
                for s in ["wpd.v1.Watchpoints", "grpc.health.v1.Health"] {
                    ensure!(services.iter().any(|v| v == s), "{what}: no {s}");
                }
            }
            ensure!(seen["symbol_address"] == t.addr("counter"), "{what}");
            ensure!(seen["hits"] == 5, "{what}");
            ensure!(
                seen["hit_functions"] == serde_json::json!(["bump_counter"]),
                "{what}"
            );
            ensure!(
                seen["hit_addresses"] == serde_json::json!([t.addr("counter")]),
                "{what}"
            );
            ensure!(seen["refusal"] == "NOT_FOUND", "{what}");
        }
        Ok(())
    }
    .await;
    let _ = t.cmd("stop").await;
    daemon.finish(result)
}
