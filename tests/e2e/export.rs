//! Export to NATS JetStream against a real `nats-server -js`: every journaled
//! event in the stream exactly once, tagged with host, pid, process and
//! thread names, although the server is killed and started again while hits
//! flow.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use prost::Message;
use tokio_stream::StreamExt;
use wpd_proto::v1::stream_events_response::Event as E;
use wpd_proto::v1::*;
use wpd_tests::{
    CTarget, Client, Daemon, NatsServer, nats_server_bin, poll_until, require_peer,
    require_root_perf, rpc_ok,
};

async fn stats(c: &mut Client) -> Result<GetStatsResponse> {
    rpc_ok("GetStats", c.get_stats(GetStatsRequest {})).await
}

/// Whether the test can run: root with perf (else it skips); a NATS server must be there.
fn can_run() -> bool {
    if !require_root_perf() {
        return false;
    }
    require_peer(
        nats_server_bin().is_some(),
        "nats-server",
        "Debian: nats-server",
    );
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_jetstream_once_across_a_server_restart() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let mut nats = NatsServer::start().await?;
    let url = nats.url();
    let daemon = Daemon::start_with_args(&[
        "--export-nats",
        &url,
        "--host-name",
        "farm-host.7",
        "--export-stream",
        "WPDTEST",
    ])
    .await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(WatchpointSpec {
                    pid: t.pid,
                    symbol: "counter".into(),
                    access: Access::Write as i32,
                    backend: Backend::Perf as i32,
                    ..Default::default()
                }),
            }),
        )
        .await?;
        t.cmd("spin 1").await?;
        // Hits flow and are exported...
        poll_until(Duration::from_secs(20), "the first exports", async || {
            let s = stats(&mut c).await?;
            Ok(if s.export_acked_seq > 200 {
                Ok(())
            } else {
                Err(format!("acked {}", s.export_acked_seq))
            })
        })
        .await?;
        // ... when the server dies, and comes back 300 ms later.
        nats.kill().await?;
        let during = stats(&mut c).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        nats.restart().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        t.cmd("stop").await?;
        // Everything journaled gets acknowledged.
        let written = poll_until(
            Duration::from_secs(60),
            "the export to catch up",
            async || {
                let s = stats(&mut c).await?;
                Ok(
                    if s.export_acked_seq == s.journal_written_seq && s.export_connected {
                        Ok(s.journal_written_seq)
                    } else {
                        Err(format!(
                            "acked {} of {} (connected {}, errors {})",
                            s.export_acked_seq,
                            s.journal_written_seq,
                            s.export_connected,
                            s.export_errors
                        ))
                    },
                )
            },
        )
        .await?;
        ensure!(
            written > during.export_acked_seq,
            "nothing was exported after the restart ({written} vs {})",
            during.export_acked_seq
        );
        let s = stats(&mut c).await?;
        ensure!(s.export_lost == 0, "{} lost", s.export_lost);

        // The stream, read with a NATS client: each event exactly once.
        let client = async_nats::connect(url.as_str()).await?;
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream("WPDTEST").await?;
        let info = stream.info().await?.clone();
        ensure!(
            info.state.messages == written,
            "{} messages in the stream, {written} events journaled (published {})",
            info.state.messages,
            s.export_published
        );
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await?;
        let mut messages = consumer.messages().await?;
        let mut seqs = BTreeSet::new();
        let mut hits = 0;
        for _ in 0..info.state.messages {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .context("the stream ended early")?
                .context("no message")??;
            let h = m.headers.as_ref().context("no headers")?;
            let get = |k: &str| h.get(k).map(|v| v.as_str().to_string());
            let seq: u64 = get("Wpd-Seq").context("no Wpd-Seq")?.parse()?;
            ensure!(seqs.insert(seq), "event {seq} twice in the stream");
            ensure!(get("Wpd-Host").as_deref() == Some("farm-host.7"), "{h:?}");
            // Each header is there with a value, or not at all.
            ensure!(
                h.iter()
                    .all(|(_, vs)| vs.iter().all(|v| !v.as_str().is_empty())),
                "a header without a value: {h:?}"
            );
            let kind = get("Wpd-Kind").context("no Wpd-Kind")?;
            ensure!(
                m.subject.as_str() == format!("wpd.farm-host_7.{kind}"),
                "subject {} for kind {kind}",
                m.subject
            );
            ensure!(
                get("Nats-Msg-Id").is_some_and(|id| id.ends_with(&format!("-{seq}"))),
                "{h:?}"
            );
            let ev = StreamEventsResponse::decode(m.payload.as_ref())?;
            ensure!(ev.seq == seq, "payload seq {} under header {seq}", ev.seq);
            ensure!(
                get("Wpd-Time-Ns") == Some(ev.time_ns.to_string()),
                "{h:?} {ev:?}"
            );
            if let Some(E::ProcessExited(_) | E::WatchpointRemoved(_)) = &ev.event {
                ensure!(get("Wpd-Tid").is_none(), "a thread for {kind}: {h:?}");
            }
            if let Some(E::Hit(hit)) = &ev.event {
                hits += 1;
                ensure!(
                    m.subject.as_str() == "wpd.farm-host_7.hit",
                    "subject {}",
                    m.subject
                );
                ensure!(get("Wpd-Pid") == Some(t.pid.to_string()), "{h:?}");
                ensure!(get("Wpd-Tid") == Some(hit.tid.to_string()), "{h:?}");
                ensure!(get("Wpd-Process").as_deref() == Some("ct-pie"), "{h:?}");
                ensure!(
                    get("Wpd-Thread").is_some_and(|t| !t.is_empty()),
                    "{h:?} {hit:?}"
                );
            }
        }
        let want: BTreeSet<u64> = (1..=written).collect();
        if seqs != want {
            let missing: Vec<_> = want.difference(&seqs).take(10).collect();
            bail!("missing from the stream: {missing:?} ...");
        }
        ensure!(hits > 200, "{hits} hits exported");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("----- nats-server log -----\n{}", nats.log());
    }
    daemon.finish(result)
}

/// A watched program names its thread `evil\nname`: the exporter sends the
/// name escaped (a line break would end a NATS header block; the client
/// library panics on one) and the daemon keeps running, also after a restart
/// that reads the same journal record again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_name_with_a_line_break_is_exported_escaped() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let nats = NatsServer::start().await?;
    let url = nats.url();
    let args = [
        "--export-nats",
        url.as_str(),
        "--host-name",
        "h",
        "--export-stream",
        "WPDEVIL",
    ];
    let mut daemon = Daemon::start_with_args(&args).await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        // "evil\nname", set by the leader: its thread and process name.
        ensure!(t.cmd("rename-hex 6576696c0a6e616d65").await? == "RENAMED");
        let mut c = daemon.client().await?;
        rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(WatchpointSpec {
                    pid: t.pid,
                    symbol: "counter".into(),
                    access: Access::Write as i32,
                    backend: Backend::Perf as i32,
                    ..Default::default()
                }),
            }),
        )
        .await?;
        for v in 1..=3 {
            ensure!(t.cmd(&format!("set counter {v}")).await? == "SET");
        }
        poll_until(
            Duration::from_secs(20),
            "the hits to be exported",
            async || {
                let s = stats(&mut c).await?;
                Ok(
                    if s.export_acked_seq >= s.journal_written_seq && s.journal_written_seq >= 3 {
                        Ok(())
                    } else {
                        Err(format!(
                            "acked {} of {}",
                            s.export_acked_seq, s.journal_written_seq
                        ))
                    },
                )
            },
        )
        .await?;
        ensure!(daemon.is_running(), "wpd died exporting the name");

        let client = async_nats::connect(url.as_str()).await?;
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream("WPDEVIL").await?;
        let n = stream.info().await?.state.messages;
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await?;
        let mut messages = consumer.messages().await?;
        let mut hits = 0;
        for _ in 0..n {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .context("the stream ended early")?
                .context("no message")??;
            let h = m.headers.as_ref().context("no headers")?;
            let ev = StreamEventsResponse::decode(m.payload.as_ref())?;
            if let Some(E::Hit(hit)) = &ev.event {
                hits += 1;
                // The event keeps the bytes; the header shows them escaped.
                ensure!(hit.thread_name == "evil\nname", "{hit:?}");
                ensure!(
                    h.get("Wpd-Thread").map(|v| v.as_str()) == Some("evil\\nname"),
                    "{h:?}"
                );
                ensure!(
                    h.get("Wpd-Process").map(|v| v.as_str()) == Some("evil\\nname"),
                    "{h:?}"
                );
            }
        }
        ensure!(hits >= 3, "{hits} hits in the stream");

        // A restart reads the journal again from the export's position: the
        // daemon that reads it back must live too.
        // Without its position the export starts over from the first event.
        daemon.kill().await?;
        std::fs::remove_file(daemon.state_dir().join("export/nats.cursor"))?;
        let mut again = Daemon::restart_from(&daemon, &args).await?;
        let mut c = again.client().await?;
        poll_until(
            Duration::from_secs(20),
            "the export to start over",
            async || {
                let s = stats(&mut c).await?;
                Ok(if s.export_acked_seq >= 3 {
                    Ok(())
                } else {
                    Err(format!("acked {}", s.export_acked_seq))
                })
            },
        )
        .await?;
        ensure!(again.is_running(), "wpd died after a restart");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Writes `text` to `dir/name`, mode 0600 (secret files must be private).
fn private_file(dir: &std::path::Path, name: &str, text: &str) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
    Ok(p)
}

/// A NATS server with TLS and a token: the exporter connects with the CA and the token from
/// files, and every event arrives. A URL carrying credentials, and a token file others can
/// read, are refused at start with what to do instead (and the secret is not printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_over_tls_with_a_token_from_a_file() -> Result<()> {
    if !can_run() {
        return Ok(());
    }
    let dir = wpd_tests::unique_temp_dir("wpd-nats-tls")?;
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let cert_pem = private_file(&dir, "cert.pem", &cert.cert.pem())?;
    let key_pem = private_file(&dir, "key.pem", &cert.signing_key.serialize_pem())?;
    let token = private_file(&dir, "nats.token", "nats-s3cret-token\n")?;
    let config = format!(
        "authorization {{ token: \"nats-s3cret-token\" }}\ntls {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
        cert_pem.display(),
        key_pem.display()
    );
    let nats = NatsServer::start_with_config(Some(&config)).await?;
    let url = nats.url().replace("nats://", "tls://");
    let result = async {
        // Credentials in the URL: refused, and not echoed.
        let with_creds = url.replace("tls://", "tls://u:pw-in-url@");
        let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .args([
                "--listen",
                &format!("unix:{}", dir.join("x.sock").display()),
            ])
            .args(["--state-dir", &dir.join("s1").display().to_string()])
            .args(["--export-nats", &with_creds])
            .env("WPD_STATE_FILE", dir.join("pa1"))
            .kill_on_drop(true)
            .output()
            .await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains("must not carry credentials")
                && !err.contains("pw-in-url"),
            "{out:?}"
        );
        // A token file others may read: refused.
        let open = dir.join("open.token");
        std::fs::write(&open, "nats-s3cret-token\n")?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644))?;
        }
        let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .args([
                "--listen",
                &format!("unix:{}", dir.join("y.sock").display()),
            ])
            .args(["--state-dir", &dir.join("s2").display().to_string()])
            .args(["--export-nats", &url])
            .args(["--export-nats-token-file", &open.display().to_string()])
            .env("WPD_STATE_FILE", dir.join("pa2"))
            .kill_on_drop(true)
            .output()
            .await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("chmod 600") && !err.contains("s3cret"),
            "{out:?}"
        );
        // TLS and the token from files: exported.
        let daemon = Daemon::start_with_args(&[
            "--export-nats",
            &url,
            "--export-nats-token-file",
            &token.display().to_string(),
            "--export-nats-tls-ca",
            &cert_pem.display().to_string(),
            "--export-stream",
            "WPDTLS",
        ])
        .await?;
        let mut t = CTarget::start("ct-pie").await?;
        let r = async {
            let mut c = daemon.client().await?;
            rpc_ok(
                "SetWatchpoint",
                c.set_watchpoint(SetWatchpointRequest {
                    spec: Some(WatchpointSpec {
                        pid: t.pid,
                        symbol: "counter".into(),
                        access: Access::Write as i32,
                        backend: Backend::Perf as i32,
                        ..Default::default()
                    }),
                }),
            )
            .await?;
            for v in 1..=5 {
                ensure!(t.cmd(&format!("set counter {v}")).await? == "SET");
            }
            poll_until(Duration::from_secs(30), "the export over TLS", async || {
                let s = stats(&mut c).await?;
                Ok(
                    if s.export_connected
                        && s.journal_written_seq >= 5
                        && s.export_acked_seq == s.journal_written_seq
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "acked {} of {} (connected {}, errors {})",
                            s.export_acked_seq,
                            s.journal_written_seq,
                            s.export_connected,
                            s.export_errors
                        ))
                    },
                )
            })
            .await?;
            ensure!(
                !daemon.log().contains("nats-s3cret-token"),
                "the token is in the daemon's log"
            );
            Ok(())
        }
        .await;
        daemon.finish(r)
    }
    .await;
    if result.is_err() {
        eprintln!("----- nats-server log -----\n{}", nats.log());
    }
    let _ = std::fs::remove_dir_all(&dir);
    result
}
