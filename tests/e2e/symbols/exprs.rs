//! Expressions: addresses taken, casts and parentheses (`wpctl symbol`), a
//! heap object watched through a cast address, and expressions that start
//! from a held frame's locals.

use super::*;

/// `wpctl symbol --pid PID EXPR` on `daemon`: its exit code and output.
async fn wpctl_symbol(daemon: &Daemon, pid: i32, expr: &str) -> Result<wpd_tests::CmdOutput> {
    run_wpctl(
        &[
            "--endpoint",
            &daemon.endpoint(),
            "symbol",
            "--pid",
            &pid.to_string(),
            expr,
        ],
        Duration::from_secs(10),
    )
    .await
}

/// The expression language over the program's DWARF types: `&` gives an
/// address (a value, never watched), casts to the program's named types
/// (struct, typedef, base types, `*` levels) view memory and convert
/// values, parentheses and C's precedence hold, and each way an expression
/// can be wrong has its message, status and `wpctl` exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_take_addresses_casts_and_parentheses() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let sess = t.addr("sess");
            let item = t.addr("item");
            // Objects: (address, size, type), from the program's own addresses.
            for (expr, addr, size, ty) in [
                ("g_sess.mode", sess + 4, 4, "enum mode"),
                ("*&g_sess.mode", sess + 4, 4, "enum mode"),
                ("(&g_sess)->flags", sess + 8, 4, "unsigned int"),
                (
                    "g_sess.grid[2][3]",
                    sess + 12 + 2 * 8 + 3 * 2,
                    2,
                    "short int",
                ),
                ("g_sess.grid[1]", sess + 12 + 8, 8, "short int[4]"),
                ("(&g_sess.grid[1][0])[2]", sess + 12 + 8 + 4, 2, "short int"),
                ("g_item->refs", item + 8, 4, "int"),
                ("(*g_item).tag", item + 12, 2, "short unsigned int"),
                ("*g_item", item, 16, "item_t"),
                (
                    &format!("((struct item *){item:#x})->refs"),
                    item + 8,
                    4,
                    "int",
                ),
                (
                    &format!("((item_t *){item:#x})->tag"),
                    item + 12,
                    2,
                    "short unsigned int",
                ),
                (&format!("*(int *){:#x}", item + 8), item + 8, 4, "int"),
                (
                    "*(unsigned char *)&g_sess.flags",
                    sess + 8,
                    1,
                    "unsigned char",
                ),
                (
                    "((struct conn *)opaque)->next->state",
                    t.addr("conn1state"),
                    4,
                    "int",
                ),
                ("*(long *)&stats", t.addr("stats"), 8, "long int"),
            ] {
                let r = resolve(&mut client, t.pid, expr).await?;
                let s = r.symbol.clone().unwrap_or_default();
                ensure!(
                    r.kind == "variable"
                        && (s.address, s.size, s.type_name.as_str()) == (addr, size, ty),
                    "{expr}: {r:?}, want {addr:#x} {size} {ty}"
                );
            }
            // Values: `&` and casts of scalars compute, in no object.
            for (expr, ty, value) in [
                (
                    "&g_sess.mode",
                    "enum mode *",
                    (sess + 4).to_le_bytes().to_vec(),
                ),
                ("&g_item->refs", "int *", (item + 8).to_le_bytes().to_vec()),
                (
                    "(unsigned long)g_sess.id",
                    "long unsigned int",
                    7u64.to_le_bytes().to_vec(),
                ),
                ("(unsigned char)g_sess.flags", "unsigned char", vec![0xfe]),
                (
                    "(uint32_t)g_sess.id",
                    "uint32_t",
                    7u32.to_le_bytes().to_vec(),
                ),
                ("(_Bool)g_version", "_Bool", vec![1]),
                ("(int)g_sess.flags", "int", (-2i32).to_le_bytes().to_vec()),
                (
                    "(long)(int)g_sess.flags",
                    "long int",
                    (-2i64).to_le_bytes().to_vec(),
                ),
            ] {
                let r = resolve(&mut client, t.pid, expr).await?;
                let s = r.symbol.clone().unwrap_or_default();
                ensure!(r.kind == "value" && s.type_name == ty, "{expr}: {r:?}");
                ensure!(
                    r.value == value,
                    "{expr}: value {:x?}, want {value:x?}",
                    r.value
                );
            }
            // A pointer converted: the address it holds, as `symbol.address`.
            let r = resolve(&mut client, t.pid, "(struct conn *)opaque").await?;
            let s = r.symbol.clone().unwrap_or_default();
            ensure!(
                r.kind == "value"
                    && s.type_name == "struct conn *"
                    && r.value.len() == 8
                    && s.address != 0
                    && r.value == s.address.to_le_bytes(),
                "{r:?}"
            );
            // A value is not watched: it says what to watch instead.
            for (expr, needles) in [
                (
                    "&g_sess.mode",
                    &["a value", "enum mode *", "watch g_sess.mode"][..],
                ),
                (
                    "(unsigned int)g_sess.id",
                    &["a value", "*(unsigned int *)&g_sess.id"][..],
                ),
            ] {
                let r = rpc(client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest {
                    spec: Some(by_name(Backend::Perf, t.pid, expr)),
                }))
                .await?;
                let st = expect_status(expr, r, Code::InvalidArgument, needles)?;
                ensure!(reason(&st).0 == wpd_proto::reason::NOT_AN_OBJECT, "{st:?}");
            }

            // `wpctl symbol`: objects and values, as a person reads them.
            let out = wpctl_symbol(&daemon, t.pid, "&g_sess.mode").await?;
            ensure!(
                out.code == Some(0)
                    && out.stdout.contains(&format!(
                        "&g_sess.mode = {:#x} <g_sess+4> (enum mode *",
                        sess + 4
                    )),
                "{out:?}"
            );
            let out = wpctl_symbol(&daemon, t.pid, "(int)g_sess.flags").await?;
            ensure!(
                out.code == Some(0) && out.stdout.contains("= -2 (int"),
                "{out:?}"
            );
            let e = format!("((item_t *){item:#x})->refs");
            let out = wpctl_symbol(&daemon, t.pid, &e).await?;
            ensure!(
                out.code == Some(0)
                    && out
                        .stdout
                        .contains(&format!("int, 4 bytes at {:#x}", item + 8)),
                "{out:?}"
            );

            // Every class of error: message, reason, wpctl's exit code (4:
            // invalid argument, 5: not found).
            let cases: &[(&str, &str, i32, &[&str])] = &[
                (
                    "g_ses.mode",
                    wpd_proto::reason::UNKNOWN_SYMBOL,
                    5,
                    &["closest: g_sess"],
                ),
                (
                    "(struct conection *)opaque",
                    wpd_proto::reason::UNKNOWN_TYPE,
                    5,
                    &["struct conection", "closest: struct conn"],
                ),
                (
                    "(itm_t *)opaque",
                    wpd_proto::reason::UNKNOWN_TYPE,
                    5,
                    &["itm_t", "item_t"],
                ),
                (
                    "*g_sess.id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess.id", "int", "not a pointer"],
                ),
                (
                    "g_sess->id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess", "struct session", "not a pointer"],
                ),
                (
                    "g_sess.id.x",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess.id", "not a struct or union"],
                ),
                (
                    "g_item.refs",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["item_t *", "not a struct or union", "use '->'"],
                ),
                (
                    "g_item->ref",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &[
                        "no member \"ref\"",
                        "closest: refs",
                        "members: key, refs, tag",
                    ],
                ),
                (
                    "g_sess.grid[3][0]",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["index 3", "g_sess.grid", "3 elements"],
                ),
                (
                    "g_sess.grid[0][4]",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["index 4", "g_sess.grid[0]", "4 elements"],
                ),
                (
                    "*0x1000",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["0x1000 is a number, not a pointer", "*(int *)0x1000"],
                ),
                (
                    "&(int)g_sess.id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["cannot take the address", "a value"],
                ),
                (
                    "(struct session)g_sess",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["cannot cast g_sess to struct session", "scalar and pointer"],
                ),
                (
                    "((struct conn *)0)->state",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["null pointer"],
                ),
                (
                    "((struct conn *)opaque->state",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["expected ')'", "column 30 (the end)"],
                ),
                (
                    "(struct conn *opaque)->state",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["type name", "column 15"],
                ),
                (
                    "g_sess.mode)",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["no '(' matches it", "column 12"],
                ),
            ];
            for &(expr, want, exit, needles) in cases {
                let st = resolve_err(&mut client, t.pid, expr).await?;
                eprintln!("{expr}: {}", st.message());
                let (got, meta) = reason(&st);
                ensure!(got == want, "{expr}: reason {got}, want {want}: {st:?}");
                for n in needles {
                    ensure!(
                        st.message().contains(n),
                        "{expr}: {n:?} not in {:?}",
                        st.message()
                    );
                }
                ensure!(!st.message().contains('\n'), "{expr}: one line");
                if want == wpd_proto::reason::UNKNOWN_TYPE {
                    ensure!(
                        meta.get("closest").is_some_and(|c| !c.is_empty()),
                        "{expr}: {meta:?}"
                    );
                }
                let out = run_wpctl(
                    &[
                        "--endpoint",
                        &daemon.endpoint(),
                        "watch",
                        "--pid",
                        &t.pid.to_string(),
                        "--symbol",
                        expr,
                    ],
                    Duration::from_secs(10),
                )
                .await?;
                ensure!(
                    out.code == Some(exit) && out.stderr.contains(needles[0]),
                    "wpctl watch --symbol {expr}: {out:?}"
                );
            }

            // Optimized out: the -O2 build's DWARF names the variable
            // without a place.
            let t2 = CTarget::start("ct-nofp").await?;
            let st = resolve_err(&mut client, t2.pid, "left_out").await?;
            ensure!(
                st.code() == Code::NotFound
                    && reason(&st).0 == wpd_proto::reason::OPTIMIZED_OUT
                    && st.message().contains("optimized out"),
                "{st:?}"
            );
            let s = resolve(&mut client, t.pid, "left_out")
                .await?
                .symbol
                .unwrap_or_default();
            ensure!(s.size == 4, "at -O0 it is there: {s:?}");
            Ok(())
        }
        .await,
    )
}

both_backends!(a_heap_object_is_watched_through_a_cast_address);

/// `((struct X *)ADDR)->field`: the common way to watch a heap object whose
/// address is known; a store into that field is a hit there.
async fn a_heap_object_is_watched_through_a_cast_address(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let want = t.addr("itemrefs");
            let expr = format!("((struct item *){:#x})->refs", t.addr("item"));
            let out = run_wpctl(
                &[
                    "--endpoint",
                    &daemon.endpoint(),
                    "watch",
                    "--pid",
                    &t.pid.to_string(),
                    "--backend",
                    match backend {
                        Backend::Ptrace => "ptrace",
                        _ => "perf",
                    },
                    "--symbol",
                    &expr,
                ],
                Duration::from_secs(20),
            )
            .await?;
            ensure!(
                out.code == Some(0) && out.stdout.contains(&format!("{want:#x}")),
                "wpctl watch: {out:?}"
            );
            t.cmd("set refs 5").await?;
            let hit = one_hit(&mut events, "set refs").await?;
            ensure!(
                hit.address == want && hit.value == 5i32.to_le_bytes(),
                "{hit:?}"
            );
            check_location(
                hit.location.as_ref().context("no location")?,
                "touch_item",
                "touch_item",
                "ct-pie",
            )
        }
        .await,
    )
}

/// In a thread held after a hit, an expression may start from a parameter
/// or local variable of any of its frames: in `touch_item(item_t *c, int
/// v)`, `c->refs` is the heap object's field, `v` the value stored, `&v` its
/// place on the stack; in the caller `set(name, v)`, `*name` reads its
/// string; names that are no local are globals still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_start_from_a_held_frames_locals() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut c, wpd_tests::hits_only(t.pid)).await?;
        let mut spec = by_name(Backend::Ptrace, t.pid, "g_item->refs");
        spec.action = wpd_proto::v1::HitAction::Stop as i32;
        set_watchpoint(&mut c, spec).await?;
        t.send("set refs 6")?;
        let hit = one_hit(&mut events, "set refs").await?;
        ensure!(hit.stopped, "{hit:?}");
        let tid = hit.tid;
        let pid = t.pid;
        let ask = |name: &str, frame: u32| ResolveSymbolRequest {
            pid,
            name: name.into(),
            address: 0,
            tid,
            frame,
        };
        let item = t.addr("item");
        let r = rpc_ok("c->refs", c.resolve_symbol(ask("c->refs", 0))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(
            r.kind == "variable"
                && (s.address, s.size, s.type_name.as_str()) == (item + 8, 4, "int")
                && s.note.contains("parameter \"c\" of frame 0"),
            "c->refs: {r:?}"
        );
        let r = rpc_ok("c", c.resolve_symbol(ask("(long)c", 0))).await?;
        ensure!(
            r.kind == "value" && r.value == item.to_le_bytes(),
            "(long)c: {r:?}"
        );
        let r = rpc_ok("v", c.resolve_symbol(ask("v", 0))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(s.type_name == "int" && s.size == 4, "v: {r:?}");
        let mem = rpc_ok(
            "ReadMemory(v)",
            c.read_memory(wpd_proto::v1::ReadMemoryRequest {
                pid: t.pid,
                address: s.address,
                length: 4,
            }),
        )
        .await?;
        ensure!(mem.data == 6i32.to_le_bytes(), "v in memory: {mem:?}");
        let r = rpc_ok("&v", c.resolve_symbol(ask("&v", 0))).await?;
        ensure!(
            r.kind == "value" && r.value == s.address.to_le_bytes(),
            "&v: {r:?}"
        );
        // The caller: set(const char *name, long v).
        let r = rpc_ok("*name", c.resolve_symbol(ask("*name", 1))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(s.type_name.contains("char") && s.size == 1, "*name: {r:?}");
        let r = rpc_ok("(int)*name", c.resolve_symbol(ask("(int)*name", 1))).await?;
        ensure!(
            r.value == i32::from(b'r').to_le_bytes(),
            "(int)*name: {r:?}"
        );
        // A name no frame has is a global.
        let r = rpc_ok("g_sess.id", c.resolve_symbol(ask("g_sess.id", 0))).await?;
        ensure!(
            r.symbol.as_ref().map(|s| s.address) == Some(t.addr("sess")),
            "{r:?}"
        );
        // Errors: a local is typed like any variable; a frame past the stack.
        let st = expect_status(
            "c.refs",
            rpc(c.resolve_symbol(ask("c.refs", 0))).await?,
            Code::InvalidArgument,
            &["item_t *", "use '->'"],
        )?;
        ensure!(
            reason(&st).0 == wpd_proto::reason::BAD_SYMBOL_PATH,
            "{st:?}"
        );
        expect_status(
            "frame 100",
            rpc(c.resolve_symbol(ask("c", 100))).await?,
            Code::InvalidArgument,
            &["no frame 100"],
        )?;
        // wpctl symbol --tid --frame.
        let out = run_wpctl(
            &[
                "--endpoint",
                &daemon.endpoint(),
                "symbol",
                "--pid",
                &t.pid.to_string(),
                "--tid",
                &tid.to_string(),
                "--frame",
                "0",
                "c->refs",
            ],
            Duration::from_secs(10),
        )
        .await?;
        ensure!(
            out.code == Some(0)
                && out
                    .stdout
                    .contains(&format!("int, 4 bytes at {:#x}", item + 8)),
            "{out:?}"
        );
        resume(&mut c, t.pid, &[]).await?;
        let reply = t.reply(Duration::from_secs(10)).await?;
        ensure!(reply.as_deref() == Some("SET"), "{reply:?}");
        // Held no more: the frame is gone, and says so.
        let st = rpc(c.resolve_symbol(ask("c->refs", 0))).await?;
        ensure!(st.is_err(), "{st:?}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}
