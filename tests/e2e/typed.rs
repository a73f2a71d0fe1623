//! Values and conditions as the watched variable's type reads them, end to
//! end through `wpctl`, against `ct-typed` (tests/c/typed.c: a `long`, an
//! `int`, a `double`, a `float`, a `bool`, an enum and a pointer): a
//! condition compares as C does (signed, floating point, an enumerator by
//! name), judged at the trap on perf and in the stop on ptrace; what a type
//! cannot take is refused naming the type; a watchpoint set by address
//! keeps its unsigned reading and says so; hits, `wpctl last`, `wpctl
//! events` (replayed from the journal), `wpctl aggregates`, `--json` and
//! `wpctl symbol` show values as their type reads them.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use wpd_proto::v1::ListWatchpointsRequest;
use wpd_tests::{Backend, CTarget, Client, CmdOutput, Daemon, both_backends, poll_until, rpc_ok};

const WPCTL_TIMEOUT: Duration = Duration::from_secs(20);

async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<CmdOutput> {
    let endpoint = daemon.endpoint();
    let mut all = vec!["--endpoint", endpoint.as_str()];
    all.extend_from_slice(args);
    run(&all).await
}

async fn run(args: &[&str]) -> Result<CmdOutput> {
    wpd_tests::run_wpctl(args, WPCTL_TIMEOUT).await
}

/// `wpctl --json ARGS`, which must succeed, parsed.
async fn json(daemon: &Daemon, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = wpctl(daemon, &all).await?;
    ensure!(
        out.code == Some(0),
        "wpctl {}: exit {:?}: {}",
        all.join(" "),
        out.code,
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .with_context(|| format!("wpctl {}: {}", all.join(" "), out.stdout))
}

/// `wpctl ARGS`, which must succeed: its output.
async fn text(daemon: &Daemon, args: &[&str]) -> Result<String> {
    let out = wpctl(daemon, args).await?;
    ensure!(
        out.code == Some(0),
        "wpctl {}: exit {:?}: {}",
        args.join(" "),
        out.code,
        out.stderr
    );
    Ok(out.stdout)
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Ptrace => "ptrace",
        _ => "perf",
    }
}

/// Watches `name` in `t` on `backend` through `wpctl watch`, with
/// `extra` arguments; the watchpoint's JSON.
async fn watch(
    daemon: &Daemon,
    backend: Backend,
    t: &CTarget,
    name: &str,
    extra: &[&str],
) -> Result<Value> {
    let pid = t.pid.to_string();
    let mut args = vec![
        "watch",
        "--pid",
        &pid,
        "--symbol",
        name,
        "--backend",
        backend_name(backend),
    ];
    args.extend_from_slice(extra);
    let v = json(daemon, &args).await?;
    ensure!(v["watchpoint"]["id"].is_u64(), "no watchpoint: {v}");
    Ok(v["watchpoint"].clone())
}

/// Hits of watchpoint `id` judged so far: reported, or not reported by its
/// condition.
async fn judged(client: &mut Client, pid: i32, id: u64) -> Result<u64> {
    let w = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid }),
    )
    .await?
    .watchpoints
    .into_iter()
    .find(|w| w.id == id)
    .context("the watchpoint is not listed")?;
    Ok(w.hits + w.hits_filtered)
}

/// Stores each of `values` into `name`, one at a time, each judged (by
/// watchpoint `id`) before the next.
async fn store(
    client: &mut Client,
    t: &mut CTarget,
    id: u64,
    name: &str,
    values: &[&str],
) -> Result<()> {
    let start = judged(client, t.pid, id).await?;
    for (i, v) in values.iter().enumerate() {
        t.cmd(&format!("set {name} {v}")).await?;
        let want = start + i as u64 + 1;
        let pid = t.pid;
        poll_until(
            Duration::from_secs(10),
            "the store to be judged",
            async || {
                let n = judged(client, pid, id).await?;
                Ok(if n >= want {
                    Ok(())
                } else {
                    Err(format!("{n} of {want} stores judged"))
                })
            },
        )
        .await?;
    }
    Ok(())
}

/// The hits `wpctl last ID` shows, as JSON.
async fn last(daemon: &Daemon, id: u64) -> Result<Vec<Value>> {
    let v = json(daemon, &["last", &id.to_string()]).await?;
    v["hits"]
        .as_array()
        .cloned()
        .with_context(|| format!("no hits in {v}"))
}

/// The little-endian bytes of `value` as `name` holds it, in hex (as
/// `--json` shows a hit's `value`).
fn bytes_of(name: &str, value: &str) -> String {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    match name {
        "refs" => hex(&value.parse::<i64>().unwrap().to_le_bytes()),
        "level" | "phase" => hex(&value.parse::<i32>().unwrap().to_le_bytes()),
        "temperature" => hex(&value.parse::<f64>().unwrap().to_le_bytes()),
        "ratio" => hex(&value.parse::<f32>().unwrap().to_le_bytes()),
        "ready" => hex(&[value.parse::<u8>().unwrap()]),
        "cursor" if value == "null" => hex(&[0; 8]),
        other => panic!("no bytes for {other}"),
    }
}

async fn unwatch(daemon: &Daemon, id: u64) -> Result<()> {
    text(daemon, &["unwatch", &id.to_string()]).await.map(drop)
}

both_backends!(
    /// Each condition reports exactly the stores C would say satisfy it:
    /// `> 100` on a `long` holding -1 does not hold (it did as unsigned),
    /// `< 0` on an `int` holding -7 does, `== -1`, `< -273` on a `double`,
    /// `>= 3.5` on a `float`, `== true`, `== DONE` (an enumerator by
    /// name), `== NULL`.
    conditions_compare_as_the_type_does
);
async fn conditions_compare_as_the_type_does(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-typed").await?;
    let result = async {
        let mut client = daemon.client().await?;
        for (name, condition, stores, reported) in [
            ("refs", "> 100", &["-1", "101", "100"][..], &["101"][..]),
            ("level", "< 0", &["7", "-7", "0"], &["-7"]),
            ("refs", "== -1", &["1", "-1"], &["-1"]),
            (
                "temperature",
                "< -273",
                &["-273.15", "-272.9", "-273", "-1e300"],
                &["-273.15", "-1e300"],
            ),
            (
                "temperature",
                ">= -273.15",
                &["-300", "-273.15", "nan"],
                &["-273.15"],
            ),
            ("ratio", ">= 3.5", &["3.25", "3.5", "-4"], &["3.5"]),
            ("ready", "== true", &["0", "1"], &["1"]),
            ("phase", "== DONE", &["1", "2", "0"], &["2"]),
            ("cursor", "== NULL", &["1", "null"], &["null"]),
        ] {
            let what = format!("{name} {condition} ({})", backend_name(backend));
            let w = watch(&daemon, backend, &t, name, &["--condition", condition])
                .await
                .context(what.clone())?;
            let id = w["id"].as_u64().unwrap();
            store(&mut client, &mut t, id, name, stores).await?;
            let got: Vec<String> = last(&daemon, id)
                .await?
                .iter()
                .map(|h| h["value"].as_str().unwrap_or_default().to_string())
                .collect();
            let want: Vec<String> = reported.iter().map(|v| bytes_of(name, v)).collect();
            ensure!(got == want, "{what}: reported {got:?}, expected {want:?}");
            unwatch(&daemon, id).await?;
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// What a type cannot take is refused, naming the type (exit 4, invalid
/// argument): a fraction for an `int`, an enumerator the enum lacks, a
/// mask on a `double`, a number out of range; a watchpoint set by address
/// keeps the unsigned reading, refuses -1, and says why in its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_type_cannot_take_is_refused_naming_it() -> Result<()> {
    if !wpd_tests::require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-typed").await?;
    let result = async {
        let pid = t.pid.to_string();
        for (name, condition, says) in [
            (
                "level",
                "== 3.5",
                &["3.5 is not an integer", "volatile int"][..],
            ),
            ("level", "== 2147483648", &["out of range", "volatile int"]),
            (
                "phase",
                "== FINISHED",
                &[
                    "FINISHED is not an enumerator",
                    "enum state",
                    "IDLE, RUNNING, DONE",
                ],
            ),
            ("temperature", "&0xff == 3", &["mask", "volatile double"]),
            (
                "temperature",
                "== 0x10",
                &["bit pattern", "volatile double"],
            ),
            ("ready", "== 2", &["true or false", "_Bool"]),
        ] {
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &pid,
                    "--symbol",
                    name,
                    "--condition",
                    condition,
                ],
            )
            .await?;
            ensure!(
                out.code == Some(4) && says.iter().all(|s| out.stderr.contains(s)),
                "{name} {condition}: exit {:?}, expected 4 saying {says:?}: {}",
                out.code,
                out.stderr
            );
        }
        // By address: no type, the bytes unsigned, as before; said so.
        let refs = format!("{:#x}", t.addr("refs"));
        let out = wpctl(
            &daemon,
            &[
                "watch",
                "--pid",
                &pid,
                "--addr",
                &refs,
                "--len",
                "8",
                "--condition",
                "== -1",
            ],
        )
        .await?;
        ensure!(
            out.code == Some(4) && out.stderr.contains("set by address"),
            "== -1 by address: exit {:?}: {}",
            out.code,
            out.stderr
        );
        let v = json(
            &daemon,
            &[
                "watch",
                "--pid",
                &pid,
                "--addr",
                &refs,
                "--len",
                "8",
                "--condition",
                "> 100",
            ],
        )
        .await?;
        let vt = &v["watchpoint"]["value_type"];
        ensure!(
            vt["kind"] == "untyped"
                && vt["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("set by address")),
            "by address: {v}"
        );
        let listed = json(&daemon, &["list"]).await?;
        ensure!(
            listed["watchpoints"][0]["value_type"]["kind"] == "untyped",
            "listing: {listed}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

both_backends!(
    /// Values as their type reads them, the raw bytes beside: in `wpctl
    /// last` (text and JSON), `wpctl events` (replayed from the journal),
    /// `wpctl aggregates` and `wpctl symbol` (the value now); a pointer
    /// names the symbol it points into.
    values_show_as_their_type_reads_them
);
async fn values_show_as_their_type_reads_them(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-typed").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = t.pid.to_string();
        // (name, stored, `value=` in text, value_typed in JSON, value_name)
        let all = [
            ("refs", "-1", "-1 (0xffffffffffffffff)", Value::from(-1), ""),
            (
                "temperature",
                "-273.15",
                "-273.15 (0xc071126666666666)",
                Value::from(-273.15),
                "",
            ),
            ("phase", "2", "DONE (0x2)", Value::from(2), "DONE"),
            ("cursor", "1", "<table+8>", Value::Null, "table+8"),
            ("level", "-7", "-7 (0xfffffff9)", Value::from(-7), ""),
            ("ratio", "3.5", "3.5 (0x40600000)", Value::from(3.5), ""),
            ("ready", "1", "true (0x1)", Value::from(true), ""),
        ];
        // Four slots a thread: four variables at a time.
        for batch in [&all[..4], &all[4..]] {
            let mut ids = Vec::new();
            for (name, stored, shown, typed, named) in batch {
                let w = watch(&daemon, backend, &t, name, &[]).await?;
                let id = w["id"].as_u64().unwrap();
                ids.push(id);
                ensure!(w["value_type"]["kind"] != "untyped", "{name}: {w}");
                store(&mut client, &mut t, id, name, &[stored]).await?;
                let line = text(&daemon, &["last", &id.to_string()]).await?;
                ensure!(
                    line.contains(&format!("value={shown}"))
                        || (*name == "cursor" && line.contains(shown)),
                    "wpctl last {id} ({name} = {stored}): {line}"
                );
                let hit = last(&daemon, id).await?.pop().context("no hit")?;
                let h = &hit;
                if *name == "cursor" {
                    let want = format!("{:#x}", t.addr("table") + 8);
                    ensure!(h["value_typed"] == want.as_str(), "{name}: {h}");
                } else {
                    ensure!(h["value_typed"] == *typed, "{name}: {h}");
                }
                ensure!(
                    h["value_name"].as_str().unwrap_or_default() == *named,
                    "{name}: {h}"
                );
            }
            for id in ids {
                unwatch(&daemon, id).await?;
            }
        }
        // The same hits replayed from the journal.
        let count = all.len().to_string();
        let replay = [
            "events",
            "--since",
            "0",
            "--hits-only",
            "--pid",
            &pid,
            "--count",
            &count,
        ];
        let events = text(&daemon, &replay).await?;
        for (name, _, shown, _, _) in &all {
            ensure!(
                events.contains(shown),
                "wpctl events: no {shown} for {name}: {events}"
            );
        }
        let mut all_json = vec!["--json"];
        all_json.extend_from_slice(&replay);
        let out = wpctl(&daemon, &all_json).await?;
        let typed: Vec<Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).map(|v| v["value_typed"].clone()))
            .collect::<Result<_, _>>()?;
        ensure!(
            typed.contains(&Value::from(-273.15)) && typed.contains(&Value::from(true)),
            "wpctl --json events: {typed:?}"
        );
        // The values now.
        for (name, _, shown, typed, _) in &all {
            let printed = text(&daemon, &["symbol", "--pid", &pid, name]).await?;
            ensure!(
                printed.contains(&format!("{name} = ")) && printed.contains(shown),
                "wpctl symbol {name}: {printed}"
            );
            let v = json(&daemon, &["symbol", "--pid", &pid, name]).await?;
            if *name != "cursor" {
                ensure!(
                    v["value_typed"] == *typed,
                    "wpctl --json symbol {name}: {v}"
                );
            }
        }
        // Aggregates: the latest values, typed.
        let w = watch(&daemon, backend, &t, "level", &["--aggregate"]).await?;
        let id = w["id"].as_u64().unwrap();
        store(&mut client, &mut t, id, "level", &["-8", "-9"]).await?;
        let table = text(&daemon, &["aggregates", &id.to_string()]).await?;
        ensure!(table.contains(" -8 -9 "), "wpctl aggregates: {table}");
        let v = json(&daemon, &["aggregates", &id.to_string()]).await?;
        let values = &v["aggregates"][0]["typed_values"];
        ensure!(
            *values == serde_json::json!([-8, -9]),
            "wpctl --json aggregates: {v}"
        );
        unwatch(&daemon, id).await
    }
    .await;
    daemon.finish(result)
}
