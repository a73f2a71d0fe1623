//! Several endpoints against mocks: every host's answer tagged and in
//! order, a host that fails named on stderr while the others go on, merged
//! event streams, and the exit status of the whole.

use super::mock::start_mock;
use super::{TempDir, endpoints_file, wpctl};

/// Several endpoints: every host's answer, each line tagged `[name]` and
/// aligned; a host that cannot be reached is one stderr line naming it, the
/// others still answer, and the exit status is 9 (3 when all fail alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_endpoints_tag_each_host_and_survive_a_dead_one() {
    let (a, _da) = start_mock().await;
    let (b, _db) = start_mock().await;
    let dir = TempDir::new("fleet");
    let gone = format!("unix:{}", dir.socket().display());
    let file = endpoints_file(
        &dir,
        &[
            "# the farm".into(),
            format!("alpha {a}"),
            String::new(),
            format!("b {b}   # second"),
            format!("gone {gone}"),
        ],
    );

    let r = wpctl(&a, &["--endpoints-file", &file, "stats"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("[alpha] processes:"), "{}", r.stdout);
    assert!(
        lines.iter().any(|l| l.starts_with("[b]     hits:")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .lines()
            .all(|l| l.starts_with("[alpha] ") || l.starts_with("[b]     "))
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .starts_with(&format!("wpctl: [gone] cannot reach wpd at {gone}: ")),
        "{}",
        r.stderr
    );

    // JSON Lines, one record per host, the failure included.
    let r = wpctl(
        &a,
        &["--endpoints-file", &file, "--json", "list", "--pid", "123"],
    )
    .await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let records: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3, "{}", r.stdout);
    assert_eq!(records[0]["host"], "alpha");
    assert_eq!(records[0]["watchpoints"][0]["id"], 8);
    assert_eq!(records[1]["host"], "b");
    assert_eq!(records[2]["host"], "gone");
    assert_eq!(records[2]["error"]["code"], "UNAVAILABLE");
    assert_eq!(records[2]["error"]["exit_code"], 3);
    let err: serde_json::Value = serde_json::from_str(r.stderr.trim()).unwrap();
    assert_eq!(err, records[2]);

    // Repeated --endpoint (on both sides of the subcommand): tagged by the
    // endpoint; all succeed: exit 0.
    let r = wpctl(&a, &["--endpoint", &a, "caps", "--endpoint", &b]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with(&format!("[{a}] arch:")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains(&format!("\n[{b}] arch:")), "{}", r.stdout);
    assert!(r.stderr.is_empty(), "{}", r.stderr);

    // --endpoint and the file together: the --endpoint hosts first.
    let r = wpctl(&a, &["--endpoint", &b, "--endpoints-file", &file, "health"]).await;
    assert_eq!(r.code, 9, "{}", r.stderr);
    let tags: Vec<&str> = r
        .stdout
        .lines()
        .chain(r.stderr.lines())
        .map(|l| l.trim_start_matches("wpctl: ").split(']').next().unwrap())
        .collect();
    assert_eq!(tags, [format!("[{b}").as_str(), "[alpha", "[b", "[gone"]);
    // The same tag twice is refused.
    let r = wpctl(&a, &["--endpoint", &a, "--endpoint", &a, "stats"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("both be tagged"), "{}", r.stderr);

    // Every host failing the same way: that code.
    let r = wpctl(
        &a,
        &[
            "--endpoint",
            &gone,
            "--endpoint",
            "unix:/nonexistent.sock",
            "list",
        ],
    )
    .await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 2, "{}", r.stderr);

    // Per-host failures from the daemon: each its own line, exit 9 (5 and 0).
    let r = wpctl(&a, &["--endpoint", &a, "--endpoint", &b, "unwatch", "999"]).await;
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 2, "{}", r.stderr);

    // Subcommands about one process or id refuse several endpoints.
    let r = wpctl(&a, &["--endpoints-file", &file, "attach", "--pid", "123"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("wpctl attach acts on one daemon"),
        "{}",
        r.stderr
    );
    // ...but a file of one endpoint is one daemon, printed as ever.
    let one_dir = TempDir::new("one");
    let one = endpoints_file(&one_dir, &[format!("solo {a}")]);
    let r = wpctl(
        "unix:/nonexistent",
        &["--endpoints-file", &one, "attach", "--pid", "123"],
    )
    .await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "attached pid 123 (perf): 1001 threads\n"),
        "{}",
        r.stderr
    );
}

/// Several endpoints' event streams merged, each line tagged with its host;
/// a bad endpoints file is one line and exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_endpoints_merge_event_streams() {
    let (a, _da) = start_mock().await;
    let (b, _db) = start_mock().await;
    let dir = TempDir::new("fleet-events");
    let file = endpoints_file(&dir, &[format!("a {a}"), format!("b {b}")]);
    let r = wpctl(&a, &["--endpoints-file", &file, "events", "--pid", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{}", r.stdout);
    for host in ["a", "b"] {
        let mine: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("[{host}] ")))
            .collect();
        assert_eq!(mine.len(), 3, "{}", r.stdout);
        assert!(
            mine[0].contains(" hit wp=7 pid=123 tid=124 "),
            "{}",
            mine[0]
        );
        assert_eq!(
            *mine[1],
            format!("[{host}] !! 5 events dropped (subscriber too slow; seq 1..=5)")
        );
    }
    // --count counts across hosts; JSON records carry the host.
    let r = wpctl(
        &a,
        &[
            "--endpoints-file",
            &file,
            "--json",
            "events",
            "--count",
            "4",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let records: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 4, "{}", r.stdout);
    assert!(records.iter().all(|v| v["host"] == "a" || v["host"] == "b"));

    std::fs::write(dir.0.join("bad"), "a tcp://h:1\nb tcp://h:2 junk\n").unwrap();
    let bad = dir.0.join("bad").display().to_string();
    let r = wpctl(&a, &["--endpoints-file", &bad, "list"]).await;
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{bad}:2: unexpected \"junk\"")),
        "{}",
        r.stderr
    );
}
