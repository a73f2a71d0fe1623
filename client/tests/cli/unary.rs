//! Unary subcommands against the mock: what each prints (text and JSON),
//! and how the daemon's refusals become one line and an exit code.

use expect_test::expect;

use super::mock::{start_mock, start_mock_with_health};
use super::{TempDir, endpoints_file, wpctl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_print_and_map_errors() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["attach", "--pid", "123"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "attached pid 123 (perf): 1001 threads\n")
    );

    let r = wpctl(
        &ep,
        &["watch", "--pid", "123", "--addr", "0x601040", "--len", "4"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads (process-wide, 4.2 ms)\n"
    );
    assert_eq!(r.stderr, "", "no warning for a mapped address");

    // An unmapped address is armed, with a warning on stderr (and in --json).
    let r = wpctl(&ep, &["watch", "--pid", "123", "--addr", "0x10"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        "wpctl: warning: address 0x10 is not mapped in process 123 now: the watchpoint is armed \
         and fires once memory is mapped there\n"
    );
    let r = wpctl(&ep, &["--json", "watch", "--pid", "123", "--addr", "0x10"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(
        v["warnings"][0].as_str().unwrap().contains("not mapped"),
        "{v}"
    );

    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--addr", "0x601040", "--access", "read",
        ],
    )
    .await;
    assert_eq!(r.code, 4);
    assert_eq!(
        r.stderr,
        "wpctl: x86-64 has no read-only watchpoints; use --access rw\n"
    );

    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--tid", "666", "--addr", "0x601040",
        ],
    )
    .await;
    assert_eq!(r.code, 6);
    assert_eq!(
        r.stderr,
        "wpctl: no free debug-register slot on tid 666 (slots: #1, #2, #3, foreign)\n"
    );
    let r = wpctl(
        &ep,
        &[
            "--json", "watch", "--pid", "123", "--tid", "666", "--addr", "0x601040",
        ],
    )
    .await;
    assert_eq!(r.code, 6);
    assert!(r.stdout.is_empty());
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["code"], "RESOURCE_EXHAUSTED");
    assert_eq!(v["error"]["reason"], wpd_proto::reason::OUT_OF_SLOTS);
    assert_eq!(v["error"]["metadata"]["tids"], "666");

    let r = wpctl(&ep, &["unwatch", "7"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (
            0,
            "removed watchpoint 7 (write 4 bytes at 0x601040 in pid 123): 42 hits\n"
        )
    );
    let r = wpctl(&ep, &["unwatch", "9"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (
            0,
            "removed policy 9 (write state.level) and its instances\n"
        )
    );
    let r = wpctl(&ep, &["unwatch", "--id", "8"]).await;
    assert_eq!((r.code, r.stderr.as_str()), (5, "wpctl: no watchpoint 8\n"));

    assert_eq!(wpctl(&ep, &["attach", "--pid", "999"]).await.code, 5);
    assert_eq!(wpctl(&ep, &["attach", "--pid", "1"]).await.code, 7);
    assert_eq!(wpctl(&ep, &["detach", "--pid", "5"]).await.code, 8);
    assert_eq!(wpctl(&ep, &["threads", "--pid", "123"]).await.code, 8);

    let r = wpctl(&ep, &["detach", "--pid", "123"]).await;
    assert_eq!(
        r.stdout,
        "detached pid 123: removed 1 watchpoint, released 1001 threads\n"
    );

    let r = wpctl(&ep, &["caps", "--json"]).await;
    assert_eq!(r.code, 0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["access_kinds"],
        serde_json::json!(["write", "rw", "exec"])
    );
    assert_eq!(v["backends"][0]["backend"], "perf");

    let r = wpctl(&ep, &["list"]).await;
    assert_eq!(r.stdout, "no watchpoints\n\nno attached processes\n");
    let r = wpctl(&ep, &["list", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect![[r#"
        ID  PID  SCOPE    ADDRESS   LEN  ACCESS  ACTION           THREADS  HITS  BACKEND
        8   123  process  0x601040  4    write   stop-all+change  3        1     ptrace

        no attached processes
    "#]]
    .assert_eq(&r.stdout);
    let r = wpctl(&ep, &["stats", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["hits"], 42);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_actions_and_on_change() {
    let (ep, _dir) = start_mock().await;
    let watch = ["watch", "--pid", "123", "--addr", "0x601040", "--len", "4"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        watch.iter().chain(extra).copied().collect()
    };

    let r = wpctl(
        &ep,
        &with(&["--backend", "ptrace", "--action", "stop", "--on-change"]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads \
         (process-wide, stop on hit, only on change, 4.2 ms)\n"
    );

    let r = wpctl(
        &ep,
        &with(&[
            "--backend",
            "ptrace",
            "--action",
            "stop-all",
            "--tid",
            "124",
        ]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 1 thread \
         (tids 124, stop all threads on hit, 4.2 ms)\n"
    );

    // `--action log` is the default and adds nothing to the line.
    let r = wpctl(&ep, &with(&["--action", "log"])).await;
    assert_eq!(
        r.stdout,
        "watchpoint 7: write 4 bytes at 0x601040 in pid 123, armed on 3 threads (process-wide, 4.2 ms)\n"
    );

    let r = wpctl(
        &ep,
        &with(&[
            "--json",
            "--backend",
            "ptrace",
            "--action",
            "stop-all",
            "--on-change",
        ]),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["watchpoint"]["action"], "stop-all");
    assert_eq!(v["watchpoint"]["only_on_change"], true);
    assert_eq!(v["watchpoint"]["backend"], "ptrace");

    // The flags reach the daemon, which refuses them without ptrace.
    let r = wpctl(&ep, &with(&["--action", "stop"])).await;
    assert_eq!(r.code, 8);
    assert_eq!(
        r.stderr,
        "wpctl: stop actions and only-on-change need the ptrace backend\n"
    );
    assert_eq!(wpctl(&ep, &with(&["--on-change"])).await.code, 8);

    let r = wpctl(&ep, &with(&["--action", "halt"])).await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("stop-all"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_prints_resumed_threads() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["resume", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "resumed 3 threads: 124,125,126\n");

    let r = wpctl(&ep, &["resume", "--pid", "123", "--tid", "125"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (0, "resumed 1 thread: 125\n"));
    let r = wpctl(
        &ep,
        &["resume", "--pid", "123", "--tid", "124,126", "--tid", "999"],
    )
    .await;
    assert_eq!(r.stdout, "resumed 2 threads: 124,126\n");

    // Nothing held is not an error.
    let r = wpctl(&ep, &["resume", "--pid", "5"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "no held threads in pid 5\n", "")
    );
    let r = wpctl(&ep, &["resume", "--pid", "123", "--tid", "7"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "no held threads in pid 123 among tids 7\n")
    );

    let r = wpctl(&ep, &["resume", "--pid", "123", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, serde_json::json!({ "resumed": [124, 125, 126] }));
    let r = wpctl(&ep, &["--json", "resume", "--pid", "5"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v, serde_json::json!({ "resumed": [] }));

    let r = wpctl(&ep, &["resume", "--pid", "77"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (8, "wpctl: pid 77 is not attached\n")
    );
    assert_eq!(wpctl(&ep, &["resume"]).await.code, 2);
    assert_eq!(
        wpctl(&ep, &["resume", "--pid", "1", "--tid", "x"])
            .await
            .code,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_show_states_and_retained_slots() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["threads", "--pid", "124"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    expect![[r#"
        TID  NAME  STATE           SLOT0  SLOT1
        124  t124  stopped (hit)   #8     -
        125  t125  stopped (peer)  #8     -
        126  t126  job-stopped     #8     retained

        pid 124: 3 threads, 2 stopped by wpd, 1 job-stopped; slots: 2 free, 3 ours, 0 foreign, 0 pending, 1 retained
    "#]].assert_eq(&r.stdout);
    let r = wpctl(&ep, &["threads", "--pid", "124", "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let states: Vec<_> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["stopped_at_hit", "stopped_by_peer", "job_stopped"]);
    assert_eq!(v["threads"][2]["slots"][1]["state"], "retained");
    assert_eq!(v["counts"]["retained"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_in_watch_symbol_and_events() {
    let (ep, _dir) = start_mock().await;

    // By name: the answer says what was resolved, and from where.
    let r = wpctl(&ep, &["watch", "--pid", "123", "--symbol", "counter"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "watchpoint 7: write counter (int, 4 bytes, target, DWARF) at 0x555500004010 in pid 123, \
         armed on 3 threads (process-wide, 4.2 ms)\n"
    );
    // --len narrows it: the description says so.
    let r = wpctl(
        &ep,
        &["watch", "--pid", "123", "--symbol", "counter", "--len", "2"],
    )
    .await;
    assert!(
        r.stdout
            .starts_with("watchpoint 7: write 2 bytes of counter (int, 4 bytes, target, DWARF)"),
        "{}",
        r.stdout
    );
    let r = wpctl(
        &ep,
        &["--json", "watch", "--pid", "123", "--symbol", "counter"],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["symbol"]["module"], "/opt/t/target");
    assert_eq!(v["symbol"]["source"], "DWARF");
    assert_eq!(v["symbol"]["size"], 4);
    assert_eq!(v["watchpoint"]["address"], "0x555500004010");
    assert_eq!(v["watchpoint"]["length"], 4);

    // An unknown name: one line with the closest names, exit 5 (not found);
    // --json carries the reason and the suggestions.
    let r = wpctl(&ep, &["watch", "--pid", "123", "--symbol", "countr"]).await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            5,
            "wpctl: no variable \"countr\" in process 123 (closest: counter)\n"
        )
    );
    let r = wpctl(&ep, &["--json", "symbol", "--pid", "123", "countr"]).await;
    assert_eq!(r.code, 5);
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    assert_eq!(v["error"]["reason"], wpd_proto::reason::UNKNOWN_SYMBOL);
    assert_eq!(v["error"]["metadata"]["closest"], "counter");
    // --symbol and --addr exclude each other.
    let r = wpctl(
        &ep,
        &[
            "watch", "--pid", "123", "--symbol", "counter", "--addr", "0x10",
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = wpctl(
        &ep,
        &[
            "watch",
            "--pid",
            "123",
            "--addr",
            "0x10",
            "--on-exec",
            "remove",
        ],
    )
    .await;
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (
            2,
            "wpctl: --on-exec needs --symbol: a watchpoint set by address is always removed at exec\n"
        )
    );

    // `wpctl symbol`: a name, an address in code, an address in nothing.
    let r = wpctl(&ep, &["symbol", "--pid", "123", "counter"]).await;
    expect![[r#"
        counter: int, 4 bytes at 0x555500004010 in target (0x4010 in the module, DWARF)
        counter = -7 (0xfffffff9)
    "#]]
    .assert_eq(&r.stdout);
    let r = wpctl(&ep, &["--json", "symbol", "--pid", "123", "counter"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        (
            &v["value"],
            &v["value_typed"],
            &v["symbol"]["value_type"]["kind"]
        ),
        (
            &serde_json::json!("f9ffffff"),
            &serde_json::json!(-7),
            &serde_json::json!("signed")
        )
    );
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0x555500001234"]).await;
    expect![[r#"
        function main+0x34 (target, 128 bytes at 0x555500001200)
        at main (target.c:42)
        build id abcd01, file offset 0x1234
    "#]]
    .assert_eq(&r.stdout);
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0x10"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "no symbol holds this address\n")
    );
    let r = wpctl(&ep, &["symbol", "--pid", "123", "0xzz"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);

    // A symbolized hit: function (file:line), then the backtrace; the
    // second hit at the same places, which the stream sent once, reads
    // the same.
    let r = wpctl(&ep, &["events", "--pid", "4"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", r.stdout);
    for i in [0, 2] {
        assert!(
            lines[i].ends_with(
                " hit wp=7 pid=123 tid=124 at set_counter (target.c:17) addr=0x601040 value=42 (0x2a)"
            ),
            "{}",
            lines[i]
        );
        assert_eq!(lines[i + 1], "    #1 main (target.c:42)");
    }
    // --json: every field of the location, the raw ip and the address
    // symbolized (one byte before it), for both hits.
    let r = wpctl(&ep, &["events", "--pid", "4", "--json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let hits: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(hits.len(), 2, "{}", r.stdout);
    for v in &hits {
        assert_eq!(v["ip"], "0x555500001111");
        assert_eq!(v["location"]["lookup_address"], "0x555500001110");
        assert_eq!(v["location"]["function"], "set_counter");
        assert_eq!(v["location"]["file"], "/src/target.c");
        assert_eq!(v["location"]["line"], 17);
        assert_eq!(v["location"]["build_id"], "abcd01");
        assert_eq!(v["location"]["file_offset"], 0x1110);
        assert_eq!(v["backtrace"][0]["function"], "main");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_stack_print_threads_and_frames() {
    let (ep, _dir) = start_mock().await;

    let r = wpctl(&ep, &["pause", "--pid", "123"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "holding 3 threads of pid 123: 124,125,126 (wpctl resume --pid 123 lets them run)\n"
    );
    let r = wpctl(&ep, &["pause", "--pid", "9"]).await;
    assert_eq!(r.code, 8, "{}", r.stderr);
    assert_eq!(r.stderr, "wpctl: pid 9 is not attached\n");

    let r = wpctl(&ep, &["stack", "--pid", "123", "--tid", "124"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].starts_with("#0  ") && lines[0].contains("work"),
        "{}",
        r.stdout
    );
    assert!(lines[0].contains("t.c:7"), "{}", r.stdout);
    assert!(
        lines[1].starts_with("#1  ") && lines[1].contains("main"),
        "{}",
        r.stdout
    );
    assert!(lines[2].contains("without frame pointers"), "{}", r.stdout);

    let r = wpctl(
        &ep,
        &[
            "--json", "stack", "--pid", "123", "--tid", "124", "--depth", "1",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["frames"].as_array().unwrap().len(), 1);
    assert_eq!(v["frames"][0]["function"], "work");
    assert_eq!(v["registers"]["rsp"], "0x7ff0");

    // --locals: each frame's variables under it, or why there are none.
    let r = wpctl(&ep, &["stack", "--pid", "123", "--tid", "124", "--locals"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "#0  work (t.c:7)\n    (param) long v = 42 (0x2a)\n    int tmp = <optimized out>\n\
         #1  main (t.c:20)\n    (t has no DWARF (build with -g))\n\
         (the frame-pointer chain ended: code built without frame pointers)\n"
    );

    // --registers: three to a line, a hostile name escaped.
    let r = wpctl(
        &ep,
        &["stack", "--pid", "123", "--tid", "124", "--registers"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", r.stdout);
    assert_eq!(
        lines[3],
        "rax    0x0000000000000001  rsp    0x0000000000007ff0  rip    0x0000000000001010"
    );
    assert!(
        lines[4].starts_with("r\\x1b[31m") && !r.stdout.contains('\x1b'),
        "{}",
        r.stdout
    );

    let r = wpctl(&ep, &["stack", "--pid", "123", "--tid", "125"]).await;
    assert_eq!(r.code, 8);
    assert!(r.stderr.contains("running"), "{}", r.stderr);
    let r = wpctl(
        &ep,
        &["stack", "--pid", "123", "--tid", "125", "--depth", "0"],
    )
    .await;
    assert_eq!(r.code, 2, "depth 0 is a usage error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_prints_the_kept_hits_oldest_first() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["last", "7"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(
        lines[0].contains("tid=124") && lines[0].contains("value=1"),
        "{}",
        r.stdout
    );
    assert!(
        lines[1].contains("tid=125") && lines[1].contains("value=2"),
        "{}",
        r.stdout
    );
    assert_eq!(lines[2], "watchpoint 7: 2 hits of 42 shown");
    let r = wpctl(&ep, &["--json", "last", "7", "--limit", "1"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["total"], 42);
    assert_eq!(v["hits"].as_array().unwrap().len(), 1);
    assert_eq!(v["hits"][0]["tid"], 125);
    let r = wpctl(&ep, &["last", "8"]).await;
    assert_eq!(r.code, 5);
    assert_eq!(r.stderr, "wpctl: no watchpoint #8\n");
}

/// `wpctl watch --comm` sets a policy (SetPolicy) and names its instances; `--tid` cannot go
/// with a policy; a watch without any target is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_a_selector_sets_a_policy() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["watch", "--comm", "fuzzer", "--symbol", "counter"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "policy 9: write counter in every process with comm fuzzer; 1 instance now \
         (pid 321 watchpoint 10)\n"
    );
    let r = wpctl(
        &ep,
        &["--json", "watch", "--comm", "fuzzer", "--symbol", "counter"],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["policy"]["instances"][0]["watchpoint_id"], 10);
    assert_eq!(v["policy"]["instances"][0]["found_by"], "kernel-record");
    assert_eq!(v["policy"]["selector"]["comm"], "fuzzer");
    let r = wpctl(
        &ep,
        &["watch", "--comm", "fuzzer", "--tid", "5", "--addr", "0x10"],
    )
    .await;
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("--tid names threads of one process"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    let r = wpctl(&ep, &["watch", "--addr", "0x10"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = wpctl(&ep, &["watch", "--exe", "/bin/true", "--addr", "0x10"]).await;
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("policies by comm only"), "{}", r.stderr);
}

/// `wpctl aggregates ID`: the counts per instruction and thread, most counted first, and the
/// totals; a watchpoint not in aggregate mode is one clear error line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_are_listed_by_count() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["aggregates", "7"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("COUNT"), "{}", r.stdout);
    assert!(
        lines[1].starts_with("1000 ") && lines[1].contains("124(pool-1)"),
        "{}",
        r.stdout
    );
    assert!(
        lines[1].contains("0x40107c") && lines[1].contains(" 42 "),
        "{}",
        r.stdout
    );
    assert!(
        lines[2].starts_with("500 ") && lines[2].contains(" 125 "),
        "{}",
        r.stdout
    );
    assert_eq!(
        lines[3],
        "watchpoint 7 (pid 123): 1500 hits aggregated, 12 streamed as samples"
    );
    let r = wpctl(&ep, &["--json", "aggregates", "7"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["aggregates"][0]["count"], 1000);
    assert_eq!(v["aggregates"][0]["values"][0], "42");
    let r = wpctl(&ep, &["aggregates", "8"]).await;
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("not in aggregate mode"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

/// `wpctl health`: 0 and `serving` when the daemon serves; one line and 3
/// when it does not, or cannot be reached; one line per host with several.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_the_standard_service() {
    let (up, _du) = start_mock_with_health(true).await;
    let (down, _dd) = start_mock_with_health(false).await;
    let r = wpctl(&up, &["health"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, format!("serving at {up}\n").as_str()),
        "{}",
        r.stderr
    );
    let r = wpctl(&up, &["--json", "health"]).await;
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["status"], "SERVING");
    assert_eq!(v["service"], "wpd.v1.Watchpoints");
    assert_eq!(v["endpoint"], up.as_str());

    let r = wpctl(&down, &["health"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        format!("wpctl: wpd at {down} is not serving (health status NOT_SERVING)\n")
    );
    let r = wpctl("unix:/nonexistent.sock", &["health"]).await;
    assert_eq!(r.code, 3, "{}", r.stderr);

    let dir = TempDir::new("fleet-health");
    let file = endpoints_file(&dir, &[format!("up {up}"), format!("down {down}")]);
    let r = wpctl(&up, &["--endpoints-file", &file, "health"]).await;
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (9, format!("[up]   serving at {up}\n").as_str()),
        "{}",
        r.stderr
    );
    assert_eq!(
        r.stderr,
        format!("wpctl: [down] wpd at {down} is not serving (health status NOT_SERVING)\n")
    );
}

/// `wpctl break`: the place it printed, `--wait` returning with the stop
/// (read from the stream, or from the kept stops when the stream dropped
/// it), exit 5 when the process exits first, a LOCATION refused in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_prints_the_place_and_waits_for_the_stop() {
    let (ep, _dir) = start_mock().await;
    let r = wpctl(&ep, &["break", "--pid", "8", "conn_new"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "breakpoint 9: conn_new at /src/conn.c:41, 0x55550000127d (server+0x127d), in pid 8: \
         holds the thread that reaches it\n"
    );
    // The stop comes after another breakpoint's.
    let r = wpctl(&ep, &["break", "--pid", "9", "conn_new", "--wait"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert_eq!(
        lines[1],
        "thread 91 of pid 8 stopped at conn_new at /src/conn.c:41 (breakpoint 9, hit 1)"
    );
    // Lost to a drop: the stops the daemon kept.
    let r = wpctl(
        &ep,
        &["--json", "break", "--pid", "8", "conn.c:41", "--wait"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["stopped"]["tid"], 81);
    assert_eq!(v["breakpoint"]["id"], 9);
    assert_eq!(v["breakpoint"]["place"]["line"], 41);
    let r = wpctl(&ep, &["break", "--pid", "10", "conn_new", "--wait"]).await;
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(
        r.stderr,
        "wpctl: process 10 exited before a thread reached breakpoint 9\n"
    );
    let r = wpctl(&ep, &["break", "--pid", "8", "conn.c:conn_new"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("not a source file"), "{}", r.stderr);
}
