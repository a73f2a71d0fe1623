//! Tidy checks that keep ARCHITECTURE.md's invariants true: each reads the
//! repository's sources and fails, naming the file and line, where one is
//! broken.
//!
//! 1. Only `daemon/src/rpc/` knows tonic (and its HTTP/2 companions).
//! 2. No debug-register bit arithmetic outside `daemon/src/arch/`: the
//!    register layout's helpers and literals appear nowhere else; nor any
//!    other x86 knowledge (`pt_regs` offsets, register names, the
//!    architecture's name, `cfg(target_arch)`).
//! 3. The core never asks which backend a process uses: no `BackendKind::`
//!    in `daemon/src/engine/`, and nothing of the perf backend (the CPU
//!    count included).
//! 4. Every Rust source file starts with a `//!` line saying what it is for.
//! 5. Every `kernel-facts §N` citation names a section of
//!    `docs/kernel-facts.md`.
//! 6. Every error status the daemon sends is built by `rpc/status.rs`'s
//!    one map, so it carries an `ErrorInfo` with its reason: no
//!    `Status::internal(...)` and the like anywhere else in `rpc/`; and
//!    each reason's wire value is its constant's name.
//! 7. A test binary made of modules (`tests/e2e/`, the daemon's and the
//!    client's) declares every file of its directory: a file left out would
//!    never be compiled nor run. And the end-to-end tests stay one binary:
//!    no `tests/tests/` (where each file would be a binary of its own; the
//!    crate has `autotests = false`, so it would not even run).
//! 8. `docs/benchmarks.md` stays readable: its summary is a table of one
//!    line per target (`| # | target | figure | floor or peer | verdict |
//!    section |`), no cell over 120 characters, each row's section a link
//!    to a heading of the file; and every link to a heading in the
//!    Markdown docs resolves.
//! 9. The ledger's protocol is the core's: no backend (`daemon/src/backend/`)
//!    reserves, commits, rolls back or marks a slot foreign in the ledger.
//!    A backend reports what became of each reservation (`ArmReport`,
//!    `StopArmer::arm`, `Host::settle`) and the core settles it.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file under `dir` (recursively), skipping build output.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !matches!(name, "target" | ".git" | "corpus" | "artifacts") {
                out.extend(rust_files(&p));
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The source directories of the workspace (and the fuzz crate).
fn sources() -> Vec<PathBuf> {
    let r = repo();
    [
        "daemon/src",
        "daemon/tests",
        "daemon/benches",
        "daemon/fuzz/src",
        "daemon/fuzz/fuzz_targets",
        "client/src",
        "client/tests",
        "adapters/dap/src",
        "adapters/dap/tests",
        "proto/src",
        "tests/src",
        "tests/e2e",
    ]
    .iter()
    .flat_map(|d| rust_files(&r.join(d)))
    .collect()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

/// Lines of code only: comments (`//`, `///`, `//!`) left out, so that the
/// checks look at what the code does, not at what its comments mention.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

/// True if `needle` occurs in `line` not as the tail of a longer name
/// (`tonic` in `tonic::Status`, not in `monotonic_ns`). A field (`.rip`)
/// matches only whole (not in `.ripple`), wherever it follows.
fn mentions(line: &str, needle: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if needle.starts_with('.') {
        return line
            .match_indices(needle)
            .any(|(i, _)| !line[i + needle.len()..].starts_with(ident));
    }
    line.match_indices(needle)
        .any(|(i, _)| !line[..i].chars().next_back().is_some_and(ident))
}

/// Every (file, line) of `files` whose code contains one of `needles`.
fn offenders(files: &[PathBuf], needles: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in code_lines(&text) {
            if let Some(needle) = needles.iter().find(|nd| mentions(line, nd)) {
                out.push(format!("{}:{n}: `{needle}` in {:?}", rel(f), line.trim()));
            }
        }
    }
    out
}

fn daemon_files_outside(prefix: &str) -> Vec<PathBuf> {
    let root = repo().join("daemon/src");
    rust_files(&root)
        .into_iter()
        .filter(|f| !f.starts_with(root.join(prefix)))
        .collect()
}

#[test]
fn only_the_rpc_layer_knows_tonic() {
    let files = daemon_files_outside("rpc");
    let bad = offenders(
        &files,
        &["tonic", "hyper::", "hyper_util", "h2::", "http_body"],
    );
    assert!(
        bad.is_empty(),
        "tonic outside daemon/src/rpc/ (ARCHITECTURE.md: only the RPC layer knows it):\n{}",
        bad.join("\n")
    );
}

#[test]
fn debug_register_layout_stays_in_arch() {
    let files = daemon_files_outside("arch");
    let bad = offenders(
        &files,
        &[
            "u_debugreg",
            "local_enable(",
            "rw_shift(",
            "len_shift(",
            "len_bits(",
            "slot_mask(",
            "HIT_MASK",
            "0b1111",
            "0x90001",
            "<< (2 *",
        ],
    );
    assert!(
        bad.is_empty(),
        "debug-register bits outside daemon/src/arch/ (use the arch helpers):\n{}",
        bad.join("\n")
    );
}

#[test]
fn other_x86_knowledge_stays_in_arch() {
    let files = daemon_files_outside("arch");
    let bad = offenders(
        &files,
        &[
            // `struct bpf_perf_event_data` / `struct pt_regs` offsets.
            "pt_regs",
            "bpf_perf_event_data",
            "const CTX_",
            // `struct user_regs_struct` fields.
            ".rip",
            ".rsp",
            ".rbp",
            // The architecture's name and its selection.
            "\"x86_64\"",
            "x86_64::",
            "target_arch",
        ],
    );
    assert!(
        bad.is_empty(),
        "x86 knowledge outside daemon/src/arch/ (add an item to arch::current and use it; \
         ARCHITECTURE.md's aarch64 row lists them):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_core_never_branches_on_the_backend() {
    let root = repo().join("daemon/src/engine");
    let bad = offenders(&rust_files(&root), &["BackendKind::", "backend::perf"]);
    assert!(
        bad.is_empty(),
        "the core names a backend kind or reaches into the perf backend (call the process's \
         backend through the trait, read what it can do from its Features; the machine's CPUs \
         are crate::cpus):\n{}",
        bad.join("\n")
    );
}

#[test]
fn only_the_core_settles_the_ledger() {
    let root = repo().join("daemon/src/backend");
    let bad = offenders(
        &rust_files(&root),
        &[
            ".commit(",
            ".rollback(",
            ".mark_foreign(",
            ".reserve_all(",
            ".reserve_one(",
            "ledger.reserve(",
            "ledger().reserve(",
            "ledger.settle(",
            "ledger().settle(",
        ],
    );
    assert!(
        bad.is_empty(),
        "a backend reserves or settles slots in the ledger itself (report each reservation's \
         Outcome in its ArmReport, or through Host::reserve_thread and Host::settle, and let \
         the core settle it):\n{}",
        bad.join("\n")
    );
}

#[test]
fn needles_match_names_and_fields() {
    assert!(mentions("use tonic::Status;", "tonic"));
    assert!(!mentions("let t = monotonic_ns();", "tonic"));
    assert!(mentions("let ip = r.rip;", ".rip"));
    assert!(!mentions("let ip = r.ip;", ".rip"));
    assert!(!mentions("s.rsplit_once(')')", ".rsp"));
}

#[test]
fn every_error_status_comes_from_the_one_map() {
    let root = repo().join("daemon/src/rpc");
    let map = root.join("status.rs");
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut bad = Vec::new();
    for f in rust_files(&root).into_iter().filter(|f| *f != map) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in code_lines(&text) {
            for (i, _) in line.match_indices("Status::") {
                let before = line[..i].chars().next_back();
                let after: String = line[i + "Status::".len()..]
                    .chars()
                    .take_while(|&c| ident(c))
                    .collect();
                let constructor = after.starts_with(|c: char| c.is_ascii_lowercase());
                if !before.is_some_and(ident) && constructor && after != "from" {
                    bad.push(format!("{}:{n}: {:?}", rel(&f), line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "error statuses built outside rpc/status.rs carry no ErrorInfo (map a WpdError with \
         status::to_status, or Status::from):\n{}",
        bad.join("\n")
    );
}

/// The wire values of `wpd_proto::reason` are what clients match on: each
/// constant's value is its name, so that code and tests name them by the
/// constant and a changed value cannot slip by.
#[test]
fn reasons_are_named_by_their_values() {
    let text = std::fs::read_to_string(repo().join("proto/src/lib.rs")).unwrap();
    let start = text.find("pub mod reason {").expect("the reason module");
    let end = start + text[start..].find("\n}\n").expect("its end");
    let mut seen = 0;
    let mut bad = Vec::new();
    for line in text[start..end].lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else {
            continue;
        };
        let (name, value) = rest.split_once(": &str = ").expect("a &str constant");
        let value = value.trim_end_matches(';').trim_matches('"');
        seen += 1;
        if name != "DOMAIN" && name != value {
            bad.push(format!("{name} = {value:?}"));
        }
    }
    assert!(seen > 20, "reasons found: {seen}");
    assert!(
        bad.is_empty(),
        "reasons whose value is not their name: {bad:?}"
    );
}

#[test]
fn every_source_file_says_what_it_is_for() {
    let bad: Vec<String> = sources()
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .map(|f| rel(&f))
        .collect();
    assert!(
        bad.is_empty(),
        "files without a `//!` header:\n{}",
        bad.join("\n")
    );
}

/// The section names `§…` of docs/kernel-facts.md (`## §3b A leader…` → `3b`).
fn fact_sections() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/kernel-facts.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("## §"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The sections a citation names: `kernel-facts §3b` → [3b]; `§1–3` → [1, 2, 3].
fn cited(after: &str) -> Vec<String> {
    let token: String = after
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '–' || *c == '-')
        .collect();
    let token = token.trim_end_matches(['-', '–']);
    match token.split_once(['–', '-']) {
        Some((a, b)) => match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(a), Ok(b)) if a <= b => (a..=b).map(|n| n.to_string()).collect(),
            _ => vec![token.to_string()],
        },
        None => vec![token.to_string()],
    }
}

#[test]
fn kernel_facts_citations_resolve() {
    let sections = fact_sections();
    assert!(sections.len() >= 8, "sections found: {sections:?}");
    let me = repo().join("daemon/tests/invariants.rs");
    let mut files: Vec<PathBuf> = sources().into_iter().filter(|f| *f != me).collect();
    for md in ["ARCHITECTURE.md", "README.md"] {
        files.push(repo().join(md));
    }
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "md") && !p.ends_with("kernel-facts.md") {
            files.push(p);
        }
    }
    let mut bad = Vec::new();
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            for (i, _) in line.match_indices("kernel-facts §") {
                seen += 1;
                let after = &line[i + "kernel-facts §".len()..];
                for s in cited(after) {
                    if !sections.contains(&s) {
                        bad.push(format!("{}:{}: §{s} is not a section", rel(f), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        seen > 5,
        "the code cites kernel-facts; found only {seen} citations"
    );
    assert!(
        bad.is_empty(),
        "kernel-facts citations that do not resolve (sections: {sections:?}):\n{}",
        bad.join("\n")
    );
}

#[test]
fn citation_parsing() {
    assert_eq!(cited("3b: x"), ["3b"]);
    assert_eq!(cited("1–3) and"), ["1", "2", "3"]);
    assert_eq!(cited("6."), ["6"]);
}

/// Configuration reaches the library one way: the `Config` `main.rs`
/// builds (`startup.rs`). The environment is read in `main.rs` only (the
/// flags' `env =` and the tests' `WPD_FAULT_*`), and no `pub fn set_*`
/// stores a setting in a static.
#[test]
fn configuration_comes_from_main_only() {
    let root = repo().join("daemon/src");
    let files: Vec<PathBuf> = rust_files(&root)
        .into_iter()
        .filter(|f| !f.ends_with("main.rs"))
        .collect();
    let bad = offenders(&files, &["std::env::var", "env::var_os"]);
    assert!(
        bad.is_empty(),
        "the environment read outside main.rs (put it in startup::Config):\n{}",
        bad.join("\n")
    );
}

/// The `mod name;` lines of a test binary's `main.rs`.
fn declared_modules(main: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(main).unwrap();
    code_lines(&text)
        .filter_map(|(_, l)| l.trim().strip_prefix("mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_test_module_is_declared() {
    let r = repo();
    let mut bad = Vec::new();
    for dir in [
        "tests/e2e",
        "daemon/tests/rpc_inprocess",
        "client/tests/cli",
    ] {
        let main = r.join(dir).join("main.rs");
        let declared = declared_modules(&main);
        assert!(!declared.is_empty(), "{dir}/main.rs declares no module");
        for f in rust_files(&r.join(dir)) {
            let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if f.parent() == Some(&r.join(dir))
                && stem != "main"
                && !declared.iter().any(|m| m == stem)
            {
                bad.push(format!("{}: no `mod {stem};` in {dir}/main.rs", rel(&f)));
            }
        }
    }
    assert!(
        !r.join("tests/tests").exists(),
        "tests/tests/ exists: the end-to-end tests are modules of tests/e2e/main.rs"
    );
    assert!(
        bad.is_empty(),
        "test files that are never compiled:\n{}",
        bad.join("\n")
    );
}

/// The anchor a Markdown heading gets (GitHub's rule for the characters
/// the docs use): lower case; letters, digits, `-` and `_` kept; a space
/// made `-`; anything else (`:`, `×`, `–`, backticks, …) dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings, in order (none from a code
/// block); a repeated heading's gets `-1`, `-2`, … as GitHub numbers them.
fn anchors(text: &str) -> Vec<String> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if fenced || !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[level..]);
        let n = seen.entry(base.clone()).or_default();
        out.push(match *n {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *n += 1;
    }
    out
}

/// The links to a heading in a Markdown text: (line, file or "" for the
/// text itself, anchor), from `[text](file.md#anchor)` and `[text](#anchor)`.
fn heading_links(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (i, _) in line.match_indices("](") {
            let target = &line[i + 2..];
            let Some(end) = target.find(')') else {
                continue;
            };
            let target = &target[..end];
            if let Some((file, a)) = target.split_once('#')
                && !file.contains("://")
            {
                out.push((n + 1, file.to_string(), a.to_string()));
            }
        }
    }
    out
}

/// The header of `docs/benchmarks.md`'s summary table.
const SUMMARY_HEADER: &str = "| # | target | figure | floor or peer | verdict | section |";

/// The longest a summary cell may be, in characters.
const SUMMARY_CELL_MAX: usize = 120;

/// What makes the summary of a benchmarks text hard to read: a cell over
/// [`SUMMARY_CELL_MAX`] characters, a row of other than six cells, a
/// section cell that is not a link to one of the text's headings.
fn summary_problems(text: &str) -> Vec<String> {
    let Some(start) = text.find("\n## Summary against the targets\n") else {
        return vec!["no \"## Summary against the targets\" section".into()];
    };
    let section = &text[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut rows = section.lines().filter(|l| l.starts_with('|'));
    match rows.next() {
        Some(SUMMARY_HEADER) => {}
        other => {
            return vec![format!(
                "the table's header is {other:?}, not {SUMMARY_HEADER:?}"
            )];
        }
    }
    let headings = anchors(text);
    let mut bad = Vec::new();
    let mut targets = 0;
    for row in rows.skip(1) {
        let cells: Vec<&str> = row
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let id = cells[0];
        targets += 1;
        if cells.len() != 6 {
            bad.push(format!("row {id}: {} cells, not 6", cells.len()));
            continue;
        }
        for c in &cells {
            let len = c.chars().count();
            if len > SUMMARY_CELL_MAX {
                bad.push(format!(
                    "row {id}: a cell of {len} characters (at most {SUMMARY_CELL_MAX}; \
                     move the detail into the section): {c}"
                ));
            }
        }
        let link = cells[5]
            .strip_prefix('[')
            .and_then(|l| l.split_once("](#"))
            .and_then(|(_, a)| a.strip_suffix(')'));
        match link {
            Some(a) if headings.iter().any(|h| h == a) => {}
            Some(a) => bad.push(format!("row {id}: #{a} is no heading of the file")),
            None => bad.push(format!(
                "row {id}: the section cell {:?} is not a link `[name](#heading)`",
                cells[5]
            )),
        }
    }
    if targets == 0 {
        bad.push("the summary table has no row".into());
    }
    bad
}

#[test]
fn the_benchmarks_summary_is_one_short_line_per_target() {
    let text = std::fs::read_to_string(repo().join("docs/benchmarks.md")).unwrap();
    let bad = summary_problems(&text);
    assert!(
        bad.is_empty(),
        "docs/benchmarks.md's summary:\n{}",
        bad.join("\n")
    );
}

#[test]
fn links_to_headings_resolve() {
    let r = repo();
    let mut files = vec![r.join("README.md"), r.join("ARCHITECTURE.md")];
    for e in std::fs::read_dir(r.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    let mut bad = Vec::new();
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, file, a) in heading_links(&text) {
            seen += 1;
            let target = if file.is_empty() {
                f.clone()
            } else {
                f.parent().unwrap().join(&file)
            };
            let Ok(linked) = std::fs::read_to_string(&target) else {
                bad.push(format!("{}:{n}: {file} does not exist", rel(f)));
                continue;
            };
            if !anchors(&linked).contains(&a) {
                bad.push(format!(
                    "{}:{n}: #{a} is no heading of {}",
                    rel(f),
                    rel(&target)
                ));
            }
        }
    }
    assert!(
        seen >= 30,
        "the summary links its sections; found only {seen} links"
    );
    assert!(
        bad.is_empty(),
        "links to headings that do not resolve:\n{}",
        bad.join("\n")
    );
}

#[test]
fn anchors_and_summary_checks() {
    let text = |rows: &str| {
        format!(
            "# B\n\n## Summary against the targets\n\n{SUMMARY_HEADER}\n|---|---|---|---|---|---|\n\
             {rows}\n## Farm: one policy × 500 threads (`per-thread`)\n\n### Run\n\n```sh\n\
             # not a heading\n```\n\n### Run\n"
        )
    };
    let check = |rows: &str, expected: &[&str]| {
        let got = summary_problems(&text(rows));
        assert_eq!(got.len(), expected.len(), "{got:?}");
        for (g, e) in got.iter().zip(expected) {
            assert!(g.contains(e), "{g:?} does not say {e:?}");
        }
    };
    assert_eq!(
        anchors(&text("")),
        [
            "b",
            "summary-against-the-targets",
            "farm-one-policy--500-threads-per-thread",
            "run",
            "run-1"
        ]
    );
    let link = "[Farm](#farm-one-policy--500-threads-per-thread)";
    check(&format!("| 1a | t | 1.0× | f | met | {link} |\n"), &[]);
    check("| 1a | t | 1.0× | f | met | [Run](#run-1) |\n", &[]);
    check(
        &format!("| 1a | t | {} | f | met | {link} |\n", "9".repeat(121)),
        &["a cell of 121 characters"],
    );
    check(
        "| 1a | t | 1.0× | f | met | [Farm](#farm) |\n",
        &["#farm is no heading"],
    );
    check("| 1a | t | 1.0× | f | met | Farm |\n", &["is not a link"]);
    check("| 1a | t | 1.0× | met | Farm |\n", &["5 cells, not 6"]);
    check("", &["has no row"]);
    assert_eq!(
        heading_links("see [a](#x), [b](other.md#y-z) and [c](https://h/p#q)"),
        [
            (1, String::new(), "x".into()),
            (1, "other.md".into(), "y-z".into())
        ]
    );
}
