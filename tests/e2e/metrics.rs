//! End-to-end test of `wpd --metrics-listen`: a real Prometheus server scrapes the daemon while
//! a watchpoint takes hits, and what it stored agrees with `GetStats` and with the hits the
//! test received.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::time::Instant;
use wpd_proto::v1::GetStatsRequest;
use wpd_tests::{
    Backend, Daemon, Event, EventStream, TargetProc, TempDir, hits_only, http_get, metrics_address,
    peer_program, require_backend, rpc_ok, set_watchpoint, write_spec,
};

/// How long Prometheus may take to start and scrape what the test waits for.
const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_what_getstats_reports() -> Result<()> {
    let prometheus = peer_program("prometheus", "Debian: prometheus");
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let started = Instant::now();
    let daemon = Daemon::start_with_args(&["--metrics-listen", "127.0.0.1:0"]).await?;
    let ready = Instant::now();
    let target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let metrics = metrics_address(&daemon.log())?;
            let mut client = daemon.client().await?;
            let mut events = EventStream::subscribe(&mut client, hits_only(target.pid)).await?;
            let resp = set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, target.pid, target.vars[0]),
            )
            .await?;
            let wp = resp.watchpoint.unwrap_or_default();
            let mut seen = 0u64;
            events
                .wait_for(Duration::from_secs(20), "20 hits", |ev| {
                    if matches!(ev, Event::Hit(h) if h.watchpoint_id == wp.id) {
                        seen += 1;
                    }
                    Ok((seen >= 20).then_some(()))
                })
                .await?;

            // The endpoint itself, before any Prometheus.
            let text = http_get(metrics, "/metrics").await?;
            let series = format!("wpd_watchpoint_hits_total{{watchpoint=\"{}\"}} ", wp.id);
            ensure!(text.contains(&series), "no {series:?} in\n{text}");

            let prom = Prometheus::start(&prometheus, metrics).await?;
            let result = async {
                let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
                loop {
                    let up = prom.query("up{job=\"wpd\"}").await?;
                    let hits = prom.query("wpd_hits_total").await?;
                    if up == Some(1.0) && hits.is_some_and(|h| h >= seen as f64) {
                        break;
                    }
                    if Instant::now() >= deadline {
                        bail!(
                            "after {PROMETHEUS_TIMEOUT:?}: up = {up:?}, wpd_hits_total = {hits:?} \
                             (the test saw {seen} hits)"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
                eprintln!(
                    "GetStats: {} processes, {} threads, {} watchpoints, {} hits, {} perf fds",
                    stats.processes, stats.threads, stats.watchpoints, stats.hits, stats.perf_fds
                );
                for (query, want) in [
                    ("wpd_attached_processes", stats.processes as f64),
                    ("wpd_tracked_threads", stats.threads as f64),
                    ("wpd_watchpoints", stats.watchpoints as f64),
                    ("wpd_perf_fds", stats.perf_fds as f64),
                    ("wpd_policies", 0.0),
                    (
                        "wpd_slots_in_use{holder=\"ours\"}",
                        f64::from(wp.armed_threads),
                    ),
                    ("wpd_slots_in_use{holder=\"foreign\"}", 0.0),
                    (
                        "wpd_rpc_duration_seconds_count{service=\"wpd.v1.Watchpoints\",\
                         method=\"SetWatchpoint\",code=\"OK\"}",
                        1.0,
                    ),
                    (
                        &format!(
                            "wpd_build_info{{version=\"{}\",arch=\"x86_64\"}}",
                            env!("CARGO_PKG_VERSION")
                        ),
                        1.0,
                    ),
                ] {
                    let got = prom.query(query).await?;
                    ensure!(got == Some(want), "{query} = {got:?}, GetStats says {want}");
                }
                // Hits keep coming: Prometheus's last sample lies between what the test saw
                // before it and what GetStats says after it.
                for query in [
                    "wpd_hits_total".to_string(),
                    format!("wpd_watchpoint_hits_total{{watchpoint=\"{}\"}}", wp.id),
                ] {
                    let got = prom.query(&query).await?.unwrap_or(-1.0);
                    ensure!(
                        seen as f64 <= got && got <= stats.hits as f64,
                        "{query} = {got}: not between {seen} and {}",
                        stats.hits
                    );
                }
                // Uptime: GetStats's lies between the test's own clocks (since just before the
                // daemon was started, and since it answered), and Prometheus's last sample at
                // most two scrape intervals (1 s) and a rounding behind it.
                let age = (
                    ready.elapsed().as_secs_f64(),
                    started.elapsed().as_secs_f64(),
                );
                ensure!(
                    stats.uptime_s as f64 >= age.0.floor() - 1.0
                        && stats.uptime_s as f64 <= age.1.ceil(),
                    "GetStats uptime {} s, the daemon started {:.1}–{:.1} s ago",
                    stats.uptime_s,
                    age.0,
                    age.1
                );
                let got = prom.query("wpd_uptime_seconds").await?.unwrap_or(-1.0);
                ensure!(
                    got >= stats.uptime_s as f64 - 3.0 && got <= stats.uptime_s as f64,
                    "wpd_uptime_seconds = {got}, GetStats says {} after it",
                    stats.uptime_s
                );
                // The test's client is connected (its event stream open) all along.
                let got = prom.query("wpd_connections_open").await?;
                ensure!(
                    got.is_some_and(|v| v >= 1.0) && stats.connections >= 1,
                    "wpd_connections_open = {got:?} and GetStats {} with the test connected",
                    stats.connections
                );
                // Counters and maxima since start: Prometheus's sample is at most what
                // GetStats says after it.
                for (query, after) in [
                    (
                        "wpd_ledger_lock_hold_seconds{quantile=\"1\"}",
                        stats.ledger_hold_max_ns as f64 / 1e9,
                    ),
                    (
                        "wpd_events_dropped_total{reason=\"subscriber_lag\"}",
                        stats.subscriber_dropped as f64,
                    ),
                ] {
                    let got = prom.query(query).await?.unwrap_or(-1.0);
                    ensure!(
                        0.0 <= got && got <= after * (1.0 + 1e-9),
                        "{query} = {got}, GetStats says {after} after it"
                    );
                }
                anyhow::Ok(())
            }
            .await;
            if result.is_err() {
                prom.print_log();
            }
            result
        }
        .await,
    )
}

/// Percent-encodes a query parameter.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server scraping one target every second, on a free loopback port, with its
/// data in a temp dir. Dropping it kills it and removes the dir, on every path.
struct Prometheus {
    child: Child,
    addr: std::net::SocketAddr,
    dir: TempDir,
}

impl Prometheus {
    /// Starts it scraping `target` as job `wpd` and waits until it answers queries.
    async fn start(bin: &Path, target: std::net::SocketAddr) -> Result<Prometheus> {
        // A port free now may be taken before Prometheus binds it: then try another.
        let mut last = anyhow!("not started");
        for _ in 0..3 {
            let mut prom = Self::spawn(bin, target)?;
            match prom.wait_ready().await {
                Ok(()) => return Ok(prom),
                Err(e) => {
                    prom.print_log();
                    last = e;
                }
            }
        }
        Err(last.context("Prometheus did not start"))
    }

    fn spawn(bin: &Path, target: std::net::SocketAddr) -> Result<Prometheus> {
        let dir = TempDir::new("wpd-prometheus")?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: wpd\n    static_configs:\n      - targets: \
                 ['{target}']\n"
            ),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Prometheus { child, addr, dir })
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + PROMETHEUS_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait()? {
                bail!("prometheus exited ({st})");
            }
            if http_get(self.addr, "/-/ready").await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("prometheus not ready after {PROMETHEUS_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of an instant query with at most one series in its answer (`None`: none).
    async fn query(&self, q: &str) -> Result<Option<f64>> {
        let body = http_get(self.addr, &format!("/api/v1/query?query={}", url_encode(q))).await?;
        let v: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("query {q}: {body}"))?;
        ensure!(v["status"] == "success", "query {q}: {body}");
        let result = v["data"]["result"]
            .as_array()
            .ok_or_else(|| anyhow!("query {q}: {body}"))?;
        ensure!(result.len() <= 1, "query {q}: several series: {body}");
        Ok(result
            .first()
            .and_then(|r| r["value"][1].as_str()?.parse().ok()))
    }

    fn print_log(&self) {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        eprintln!("----- prometheus log -----\n{log}\n----- end of prometheus log -----");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts the child in its own process group and kills it if this test process dies first.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe; it runs between fork and exec.
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
