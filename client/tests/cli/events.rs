//! `wpctl events` against the mock: lines and JSON records, `--count`, a
//! stream the server ends, a reader that goes away, `--since` replays.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::mock::start_mock;
use super::wpctl;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_stopped_hits_and_old_values() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["events", "--pid", "3"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.ends_with(
            " hit wp=8 pid=123 tid=124 ip=0x401000 addr=0x601040 \
             old=41 (0x29) → value=42 (0x2a) STOPPED\n"
        ),
        "{}",
        r.stdout
    );
    let r = wpctl(&ep, &["events", "--pid", "3", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim_end()).unwrap();
    assert_eq!(v["stopped"], true);
    assert_eq!(v["old_value"], "29000000");
    assert_eq!(v["value"], "2a000000");
    assert_eq!(v["backend"], "ptrace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_count_and_end() {
    let (ep, _dir) = start_mock().await;

    // The server ends the stream: exit 0 after all its events.
    let r = wpctl(&ep, &["events", "--pid", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<_> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].ends_with(" hit wp=7 pid=123 tid=124 ip=0x401000 addr=0x601040 value=42 (0x2a)"),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1],
        "!! 5 events dropped (subscriber too slow; seq 1..=5)"
    );
    assert!(lines[2].ends_with(" thread-start pid=123 tid=125 parent=124 inherited=7"));

    // --count stops a stream that would go on forever, counting the drop notice.
    let r = wpctl(&ep, &["events", "--count", "2", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["type"], "hit");
    assert_eq!(lines[0]["value"], "2a000000");
    assert_eq!(lines[0]["value_le"], 42);
    assert_eq!(lines[0]["stopped"], false);
    assert!(lines[0]["old_value"].is_null());
    assert_eq!(lines[0]["backend"], "perf");
    assert_eq!(lines[1]["type"], "dropped");
    assert_eq!(lines[1]["count"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_exit_quietly_when_stdout_closes() {
    let (ep, _dir) = start_mock().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wpctl"))
        .args(["events", "--pid", "2"])
        .env("WPD_ENDPOINT", &ep)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first event");
    assert!(first.contains(" hit wp=7 "), "{first}");
    drop(lines); // Like `wpctl events | head -1`.
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("wpctl kept running after its stdout closed")
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// `events --since`: a sequence number sets `after_seq`, a time or an age
/// `since_time_ns`; a daemon without a journal is one clear line (exit 8);
/// a bad SPEC is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_since_sets_the_replay_fields() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["--json", "events", "--pid", "7", "--since", "1234"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let seqs: Vec<u64> = r
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1235, 1236]);

    let r = wpctl(
        &ep,
        &[
            "--json",
            "events",
            "--pid",
            "7",
            "--since",
            "2026-12-02T11:00:00+01:00",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["time_ns"], 1_796_205_600_000_000_000u64);

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let r = wpctl(&ep, &["--json", "events", "--pid", "7", "--since", "10m"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let t = v["time_ns"].as_u64().unwrap();
    let ten_minutes = 600_000_000_000u64;
    assert!(
        t >= before - ten_minutes && t < before - ten_minutes + 30_000_000_000,
        "since_time_ns {t}, now {before}"
    );

    let r = wpctl(&ep, &["events", "--pid", "6", "--since", "5"]).await;
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: wpd at {ep} keeps no event journal")),
        "{}",
        r.stderr
    );
    let r = wpctl(&ep, &["--json", "events", "--pid", "6", "--since", "5"]).await;
    let v: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(v["error"]["reason"], wpd_proto::reason::NO_JOURNAL);
    assert_eq!(v["error"]["code"], "FAILED_PRECONDITION");

    for bad in ["yesterday", "2026-12-02T10:00:00", "1mo"] {
        let r = wpctl(&ep, &["events", "--since", bad]).await;
        assert_eq!(r.code, 2, "--since {bad}: {}", r.stderr);
        assert!(r.stderr.contains("--since"), "{}", r.stderr);
    }
}
