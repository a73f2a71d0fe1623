//! One `wpctl` driving a fleet: three real daemons on loopback TCP with TLS and a token, an
//! endpoint nobody listens on, and one whose per-line token is wrong, all in one endpoints
//! file whose lines each name their token file (`--token-file` serves `--endpoint` only, and
//! with an endpoints file alone it is refused). `watch` sets one policy by command name on every host, `list`, `stats`, `health`
//! and `events` answer from every host with each line or record tagged by it, the dead and
//! the refusing host are each named on stderr while the others succeed (exit 9), and
//! `unwatch` over repeated `--endpoint`s succeeds everywhere (exit 0).
//!
//! The three daemons share this machine's kernel, so each one's policy finds all three
//! targets (the test's own C programs, started under a name of the test's own): every host
//! holds three instances, and one store in a target is a hit on every host.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use wpd_proto::v1::GetStatsRequest;
use wpd_tests::{
    CTarget, CmdOutput, TcpDaemon, bin_path, ctarget_path, free_port, poll_until,
    require_root_perf, run_wpctl, unique_temp_dir,
};

/// Longest a `wpctl` run, a policy's arming or an event may take.
const T: Duration = Duration::from_secs(30);
/// The hosts that answer, in file order.
const HOSTS: [&str; 3] = ["h1", "h2", "h3"];
/// The host nobody listens at.
const DOWN: &str = "down";
/// The host whose line names a wrong token.
const INTRUDER: &str = "intruder";

/// What the test set up: the endpoints file, the global TLS flag, and the token file (named
/// by the file's lines, and given as `--token-file` to `--endpoint` runs).
struct Fleet {
    /// The endpoints file.
    file: String,
    /// `--tls-ca` (the daemons' self-signed certificate).
    ca: String,
    /// The daemons' token file (mode 0600).
    token: String,
    /// The dead host's endpoint.
    down: String,
}

impl Fleet {
    /// Runs `wpctl --endpoints-file F --tls-ca C args...`.
    async fn wpctl(&self, args: &[&str]) -> Result<CmdOutput> {
        let mut all = vec!["--endpoints-file", &self.file, "--tls-ca", &self.ca];
        all.extend_from_slice(args);
        run_wpctl(&all, T).await
    }

    /// Starts `wpctl ... args...` in the background (killed when dropped).
    fn spawn_wpctl(&self, args: &[&str]) -> Result<tokio::process::Child> {
        tokio::process::Command::new(bin_path("wpctl"))
            .args(["--endpoints-file", &self.file, "--tls-ca", &self.ca])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting wpctl events")
    }
}

/// Removes a directory when dropped.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A command name only this test's processes have (at most 15 bytes, the kernel's comm).
fn unique_comm() -> String {
    format!("wpfleet{}", std::process::id() % 100_000_000)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.display().to_string())
}

/// Like [`write`], readable by its owner only (as `wpctl` wants a token file).
fn write_private(dir: &Path, name: &str, text: &str) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = write(dir, name, text)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

/// The host of a tagged text line (`[h1]   ...` → `h1`) and the rest.
fn untag(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('[')?;
    let (host, rest) = rest.split_once(']')?;
    Some((host, rest.trim_start()))
}

/// Exit 9, and on stderr exactly one text line for each host in `failed`, each naming
/// the host and saying what went wrong.
fn ensure_partial(out: &CmdOutput, what: &str, failed: &[&str], fleet: &Fleet) -> Result<()> {
    ensure!(
        out.code == Some(9),
        "{what}: expected exit code 9, got {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    ensure!(
        lines.len() == failed.len(),
        "{what}: expected {} stderr lines: {:?}",
        failed.len(),
        out.stderr
    );
    for host in failed {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("wpctl: [{host}] ")))
            .with_context(|| format!("{what}: [{host}] not named on stderr: {:?}", out.stderr))?;
        let why = match *host {
            DOWN => format!("cannot reach wpd at {}", fleet.down),
            _ => "invalid token".to_string(),
        };
        ensure!(line.contains(&why), "{what}: {line:?} does not say {why:?}");
    }
    Ok(())
}

/// The JSON Lines of a `--json` run, by host (one record each for unary commands).
fn records(out: &CmdOutput, what: &str) -> Result<Vec<Value>> {
    out.stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .with_context(|| format!("{what}: not a JSON line: {l:?}"))
        })
        .collect()
}

/// In `--json` mode: the dead and the refusing host are records with "host" and "error"
/// on stdout (and the same JSON on stderr), with their exit codes.
fn ensure_error_records(all: &[Value], out: &CmdOutput, what: &str) -> Result<()> {
    for (host, code, exit) in [(DOWN, "UNAVAILABLE", 3), (INTRUDER, "UNAUTHENTICATED", 7)] {
        let r = all
            .iter()
            .find(|r| r["host"] == host)
            .with_context(|| format!("{what}: no record for {host}: {}", out.stdout))?;
        ensure!(
            r["error"]["code"] == code && r["error"]["exit_code"] == exit,
            "{what}: record of {host}: {r}"
        );
        ensure!(
            out.stderr
                .lines()
                .any(|l| serde_json::from_str::<Value>(l).ok().as_ref() == Some(r)),
            "{what}: the error of {host} is not on stderr: {:?}",
            out.stderr
        );
    }
    Ok(())
}

/// Nine hit records: on each live host, one from each target, target `i` having stored
/// `100 + i`.
fn ensure_hits_of_each_target(
    all: &[Value],
    targets: &[CTarget],
    out: &CmdOutput,
    what: &str,
) -> Result<()> {
    let hits: Vec<&Value> = all.iter().filter(|r| r["type"] == "hit").collect();
    ensure!(hits.len() == 9, "{what}: 9 hits: {}", out.stdout);
    let want: BTreeMap<i64, u64> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.pid as i64, 100 + i as u64))
        .collect();
    for host in HOSTS {
        let seen: BTreeMap<i64, u64> = hits
            .iter()
            .filter(|h| h["host"] == host)
            .map(|h| {
                (
                    h["pid"].as_i64().unwrap_or(0),
                    h["value_le"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect();
        ensure!(
            seen == want,
            "{what} of {host}: (pid, value) {seen:?}, expected {want:?}"
        );
    }
    Ok(())
}

/// Waits until every daemon counts `n` event subscribers.
async fn subscribers(daemons: &[TcpDaemon], n: u32) -> Result<()> {
    for d in daemons {
        let mut client = d.client().await?;
        poll_until(
            T,
            &format!("{n} subscribers on {}", d.endpoint()),
            async || {
                let s = client
                    .get_stats(d.request(GetStatsRequest {}))
                    .await?
                    .into_inner();
                Ok(if s.subscribers == n {
                    Ok(())
                } else {
                    Err(format!("{} subscribers", s.subscribers))
                })
            },
        )
        .await?;
    }
    Ok(())
}

/// Waits for a background `wpctl` to finish and collects what it printed.
async fn finish(mut child: tokio::process::Child, what: &str) -> Result<CmdOutput> {
    let mut stdout = child.stdout.take().context("stdout is piped")?;
    let mut stderr = child.stderr.take().context("stderr is piped")?;
    let (mut out, mut err) = (String::new(), String::new());
    let done = tokio::time::timeout(T, async {
        let (a, b) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        a?;
        b?;
        child.wait().await
    })
    .await;
    let status = match done {
        Ok(status) => status?,
        Err(_) => bail!("{what} did not finish within {T:?}; so far:\n{out}\n{err}"),
    };
    Ok(CmdOutput {
        code: status.code(),
        stdout: out,
        stderr: err,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wpctl_drives_three_daemons_past_a_dead_and_a_refusing_one() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-fleet")?;
    let _remove = RemoveDir(dir.clone());
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let ca = write(&dir, "cert.pem", &cert.cert.pem())?;
    let key = write(&dir, "key.pem", &cert.signing_key.serialize_pem())?;
    let token = write_private(&dir, "token", "fleet-token\n")?;
    write_private(&dir, "wrong.token", "not-the-fleet-token\n")?;

    let mut daemons = Vec::new();
    for _ in HOSTS {
        daemons
            .push(TcpDaemon::start_tls(Path::new(&ca), Path::new(&key), Path::new(&token)).await?);
    }
    let down = format!("https://127.0.0.1:{}", free_port()?);
    let comm = unique_comm();
    let link = dir.join(&comm);
    std::os::unix::fs::symlink(ctarget_path("ct-pie"), &link)?;
    let mut targets = Vec::new();
    for _ in HOSTS {
        targets.push(CTarget::start_path(&link, &comm).await?);
    }
    let file = write(
        &dir,
        "fleet",
        &format!(
            "# the test's fleet\n\
             h1 {} token-file=token\n\
             h2 {} token-file=token\n\
             \n\
             h3 {} token-file=token   # the last live one\n\
             {DOWN} {down}\n\
             {INTRUDER} {} token-file=wrong.token\n",
            daemons[0].endpoint(),
            daemons[1].endpoint(),
            daemons[2].endpoint(),
            daemons[0].endpoint(),
        ),
    )?;
    let fleet = Fleet {
        file,
        ca,
        token,
        down,
    };

    let result = run(&fleet, &daemons, &mut targets, &comm).await;
    if result.is_err() {
        for d in &daemons {
            d.print_log("the test failed");
        }
    }
    result
}

async fn run(
    fleet: &Fleet,
    daemons: &[TcpDaemon],
    targets: &mut [CTarget],
    comm: &str,
) -> Result<()> {
    let pids: BTreeSet<i64> = targets.iter().map(|t| t.pid as i64).collect();
    let both = [DOWN, INTRUDER];

    // --token-file with the endpoints file alone would go to no daemon: refused.
    let out = fleet
        .wpctl(&["--token-file", &fleet.token, "stats"])
        .await?;
    ensure!(
        out.code == Some(2)
            && out
                .stderr
                .contains("--token-file is sent only to the daemons"),
        "--token-file with only an endpoints file: {out:?}"
    );

    // One policy by name on every host, each reporting its own id.
    let out = fleet
        .wpctl(&["watch", "--comm", comm, "--symbol", "counter"])
        .await?;
    ensure_partial(&out, "watch", &both, fleet)?;
    let mut policy_ids = BTreeMap::new();
    for line in out.stdout.lines() {
        let (host, rest) = untag(line).with_context(|| format!("untagged line {line:?}"))?;
        if let Some(id) = rest
            .strip_prefix("policy ")
            .and_then(|r| r.split(':').next())
        {
            policy_ids.insert(host.to_string(), id.parse::<u64>()?);
        }
    }
    ensure!(
        policy_ids.keys().map(String::as_str).eq(HOSTS),
        "watch: a policy line from each of {HOSTS:?}: {:?}",
        out.stdout
    );

    // Every host arms its policy in all three targets (one kernel for all).
    let listed = poll_until(
        T,
        "every host's policy to arm three instances",
        async || {
            let out = fleet.wpctl(&["--json", "list"]).await?;
            let all = records(&out, "list --json")?;
            for host in HOSTS {
                let Some(r) = all.iter().find(|r| r["host"] == host) else {
                    return Ok(Err(format!("no record for {host}: {}", out.stdout)));
                };
                let armed: BTreeSet<i64> = r["policies"][0]["instances"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i["pid"].as_i64())
                    .collect();
                if armed != pids {
                    return Ok(Err(format!(
                        "{host}: instances in {armed:?}, targets {pids:?}"
                    )));
                }
            }
            Ok(Ok((out, all)))
        },
    )
    .await?;
    let (out, all) = listed;
    ensure!(
        out.code == Some(9),
        "list --json: exit {:?}: {}",
        out.code,
        out.stderr
    );
    ensure!(
        all.len() == HOSTS.len() + 2,
        "list --json: one record per host: {}",
        out.stdout
    );
    ensure_error_records(&all, &out, "list --json")?;

    // stats: counted on each host.
    let out = fleet.wpctl(&["--json", "stats"]).await?;
    ensure!(
        out.code == Some(9),
        "stats --json: exit {:?}: {}",
        out.code,
        out.stderr
    );
    let all = records(&out, "stats --json")?;
    for host in HOSTS {
        let r = all
            .iter()
            .find(|r| r["host"] == host)
            .with_context(|| format!("stats: no record for {host}: {}", out.stdout))?;
        ensure!(
            r["processes"] == 3 && r["watchpoints"] == 3,
            "stats of {host}: {r}"
        );
    }
    ensure_error_records(&all, &out, "stats --json")?;

    // health: needs no token, so only the dead host fails.
    let out = fleet.wpctl(&["health"]).await?;
    ensure_partial(&out, "health", &[DOWN], fleet)?;
    let serving: Vec<(&str, bool)> = out
        .stdout
        .lines()
        .filter_map(untag)
        .map(|(host, said)| (host, said.starts_with("serving at ")))
        .collect();
    ensure!(
        serving == [("h1", true), ("h2", true), ("h3", true), (INTRUDER, true)],
        "health: {:?}",
        out.stdout
    );

    // events, JSON: one store in each target is a hit on every host: 9 records.
    let child = fleet.spawn_wpctl(&["--json", "events", "--hits-only", "--count", "9"])?;
    subscribers(daemons, 1).await?;
    for (i, t) in targets.iter_mut().enumerate() {
        t.cmd(&format!("set counter {}", 100 + i)).await?;
    }
    let out = finish(child, "events --json").await?;
    ensure!(
        out.code == Some(9),
        "events --json: exit {:?}: {}",
        out.code,
        out.stderr
    );
    let all = records(&out, "events --json")?;
    ensure_error_records(&all, &out, "events --json")?;
    ensure_hits_of_each_target(&all, targets, &out, "events --json")?;

    // events --since 0: the same hits again, replayed from each daemon's journal.
    subscribers(daemons, 0).await?;
    let out = fleet
        .wpctl(&[
            "--json",
            "events",
            "--hits-only",
            "--since",
            "0",
            "--count",
            "9",
        ])
        .await?;
    ensure!(
        out.code == Some(9),
        "events --since 0: exit {:?}: {}",
        out.code,
        out.stderr
    );
    let all = records(&out, "events --since 0")?;
    ensure_error_records(&all, &out, "events --since 0")?;
    ensure_hits_of_each_target(&all, targets, &out, "events --since 0")?;

    // events, text: each line tagged.
    subscribers(daemons, 0).await?;
    let child = fleet.spawn_wpctl(&["events", "--hits-only", "--count", "3"])?;
    subscribers(daemons, 1).await?;
    targets[1].cmd("set counter 200").await?;
    let out = finish(child, "events").await?;
    ensure_partial(&out, "events", &both, fleet)?;
    let mut tagged: Vec<(&str, &str)> = out.stdout.lines().filter_map(untag).collect();
    tagged.sort();
    ensure!(
        tagged.iter().map(|(h, _)| *h).eq(HOSTS) && out.stdout.lines().count() == 3,
        "events: one line from each of {HOSTS:?}: {:?}",
        out.stdout
    );
    let from = format!(" pid={}({comm}) ", targets[1].pid);
    for (host, line) in &tagged {
        ensure!(
            line.contains(" hit wp=") && line.contains(&from) && line.contains(" value=200 (0xc8)"),
            "events of {host}: {line:?}"
        );
    }

    // unwatch over repeated --endpoint, the global token and CA: all succeed, exit 0.
    let ids: BTreeSet<u64> = policy_ids.values().copied().collect();
    ensure!(
        ids.len() == 1,
        "fresh daemons gave different policy ids: {policy_ids:?}"
    );
    let id = ids.first().copied().unwrap_or(0).to_string();
    let endpoints: Vec<String> = daemons.iter().map(TcpDaemon::endpoint).collect();
    let mut args = vec!["--tls-ca", &fleet.ca, "--token-file", &fleet.token];
    for e in &endpoints {
        args.extend(["--endpoint", e.as_str()]);
    }
    let mut unwatch = args.clone();
    unwatch.extend(["unwatch", &id]);
    let out = run_wpctl(&unwatch, T).await?;
    ensure!(
        out.code == Some(0) && out.stderr.is_empty(),
        "unwatch on every host: {out:?}"
    );
    let tagged: Vec<(&str, &str)> = out.stdout.lines().filter_map(untag).collect();
    ensure!(
        tagged.len() == 3
            && tagged
                .iter()
                .zip(&endpoints)
                .all(|((h, rest), e)| e.ends_with(h)
                    && rest.starts_with(&format!("removed policy {id} "))),
        "unwatch: tagged by HOST:PORT in order: {:?}",
        out.stdout
    );
    let mut stats = args.clone();
    stats.extend(["--json", "stats"]);
    let out = run_wpctl(&stats, T).await?;
    ensure!(out.code == Some(0), "stats after unwatch: {out:?}");
    for r in records(&out, "stats --json")? {
        ensure!(r["watchpoints"] == 0, "after unwatch: {r}");
    }

    for t in targets.iter_mut() {
        ensure!(t.try_status()?.is_none(), "target {} ended", t.pid);
    }
    Ok(())
}
