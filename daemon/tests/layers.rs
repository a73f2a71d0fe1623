//! Tidy check of the crates' ground plan, read from their imports: every
//! `crate::` and `super::` path a file names (in `use` trees and in code)
//! is resolved to the file that defines it. What a file imports from its
//! own ancestors or descendants (a parent declaring and assembling its
//! children, children implementing their parent's traits) is its module's
//! own family and is left out; siblings and cousins count. Two rules, each
//! failing with the files and lines concerned:
//!
//! 1. No import cycle between files, in the daemon, the client, the DAP
//!    adapter and the proto crate.
//! 2. In the daemon, no file imports from a layer above its own (the layers
//!    below, bottom first), except the imports [`ALLOWED`] names, each with
//!    why.
//!
//! Test modules (`#[cfg(test)] mod ... { }`) are left out: a unit test may
//! use whatever it tests with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the daemon crate sits in the workspace")
        .to_path_buf()
}

/// The daemon's layers, bottom first: a file belongs to the first layer
/// with a prefix of its path (relative to `daemon/src`); a file may import
/// from its own layer and those below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "the machine and plain data",
        &[
            "arch/",
            "clock.rs",
            "cpus.rs",
            "faststrings.rs",
            "sched.rs",
            "secret.rs",
            "range.rs",
            "model.rs",
            "filter.rs",
            "value.rs",
        ],
    ),
    (
        "the kernel's and the daemon's files",
        &["procfs.rs", "pidns.rs", "bpf/", "statedir.rs"],
    ),
    ("symbols", &["symbols/"]),
    ("errors", &["error.rs"]),
    (
        "callers and events",
        &["authz.rs", "events.rs", "aggregate.rs", "signals.rs"],
    ),
    ("the ledger and shared state", &["ledger/", "state.rs"]),
    ("the backends", &["backend/"]),
    ("an event's bytes", &["wire/"]),
    ("the journal and export", &["journal/", "export/"]),
    ("the engine", &["engine/"]),
    ("the API's messages", &["convert/"]),
    ("the service", &["service/"]),
    ("the transport", &["rpc/"]),
    ("startup", &["startup.rs", "lib.rs", "main.rs"]),
];

/// Imports from a layer below to one above, allowed by name: (importing
/// file, imported file, why).
const ALLOWED: &[(&str, &str, &str)] = &[];

/// A file's module path (`backend/perf/mod.rs` → `backend::perf`).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of `text` without comments, string literals' contents, and
/// `#[cfg(test)]` items; with each kept character's line number.
fn code_of(text: &str) -> Vec<(char, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::with_capacity(chars.len());
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
            continue;
        }
        if c == '"' {
            // A string (raw strings contain no paths we care about either).
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(('"', line));
            continue;
        }
        if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // A char literal ('{', ':').
            i += 3;
            continue;
        }
        if c == '\'' && next == Some('\\') {
            while i < chars.len() && chars[i] != '\'' || i == 0 {
                i += 1;
            }
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '\n' {
            line += 1;
        }
        out.push((c, line));
        i += 1;
    }
    strip_tests(out)
}

/// Leaves out every item after a `#[cfg(test)]` attribute (to its closing
/// brace, or its `;`).
fn strip_tests(code: Vec<(char, usize)>) -> Vec<(char, usize)> {
    let s: String = code.iter().map(|(c, _)| *c).collect();
    let mut keep = vec![true; code.len()];
    let mut from = 0;
    while let Some(at) = s[from..].find("#[cfg(test)]") {
        let start = from + at;
        let bytes: Vec<char> = s.chars().collect();
        // `s` is ASCII where it matters; find the item's end by braces.
        let mut j = start + "#[cfg(test)]".len();
        let mut depth = 0i32;
        let mut end = bytes.len();
        while j < bytes.len() {
            match bytes[j] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        for k in keep.iter_mut().take(end).skip(start) {
            *k = false;
        }
        from = end.min(s.len());
    }
    code.into_iter()
        .zip(keep)
        .filter_map(|(c, k)| k.then_some(c))
        .collect()
}

/// Every path the code names, with its line and whether it is a `pub use`
/// (a re-export): the paths of `use` trees (expanded) and qualified paths
/// (`a::b::c`).
fn paths_of(code: &[(char, usize)]) -> Vec<(Vec<String>, usize, bool)> {
    let s: String = code.iter().map(|(c, _)| *c).collect();
    let chars: Vec<char> = s.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        // `use` trees.
        let at_use = s[i..].starts_with("use ")
            && (i == 0 || !ident(chars[i - 1]))
            && !s[..i].trim_end().ends_with("::");
        if at_use {
            let end = s[i..].find(';').map_or(chars.len(), |e| i + e);
            let tree: String = s[i + 4..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let before = s[..i].trim_end();
            let public =
                before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
            for p in expand(&tree) {
                out.push((p, code[i].1, public));
            }
            i = end;
            continue;
        }
        // A qualified path: `seg::seg(::seg)*` starting at an identifier.
        if ident(chars[i]) && (i == 0 || !(ident(chars[i - 1]) || chars[i - 1] == ':')) {
            let mut j = i;
            let mut segs = Vec::new();
            loop {
                let st = j;
                while j < chars.len() && ident(chars[j]) {
                    j += 1;
                }
                segs.push(chars[st..j].iter().collect::<String>());
                if s[j..].starts_with("::") && chars.get(j + 2).is_some_and(|c| ident(*c)) {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push((segs, code[i].1, false));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The paths of a `use` tree (`a::{b::c,d}` → `a::b::c`, `a::d`).
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], t: &str, out: &mut Vec<Vec<String>>) {
        let t = t.trim();
        if let Some(open) = t.find('{') {
            let head = t[..open].trim().trim_end_matches("::");
            let mut p = prefix.to_vec();
            p.extend(
                head.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&p, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            go(&p, &inner[start..], out);
        } else if !t.is_empty() {
            let t = t.split(" as ").next().unwrap_or(t);
            let mut p = prefix.to_vec();
            p.extend(
                t.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty() && *s != "*")
                    .map(String::from),
            );
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// A crate's files and the import edges between them: (from, to) → the
/// lines of `from` naming `to`.
struct Graph {
    files: BTreeSet<String>,
    edges: BTreeMap<(String, String), Vec<usize>>,
}

fn graph(src: &Path) -> Graph {
    let mut files = BTreeMap::new();
    collect(src, src, &mut files);
    let by_module: BTreeMap<Vec<String>, String> = files
        .keys()
        .map(|rel| (module_of(rel), rel.clone()))
        .collect();
    let resolve = |path: &[String]| -> Option<String> {
        (1..=path.len())
            .rev()
            .find_map(|n| by_module.get(&path[..n]).cloned())
    };
    let mut edges: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (rel, text) in &files {
        let module = module_of(rel);
        let code = code_of(text);
        for (path, line, _) in paths_of(&code) {
            let mut abs: Vec<String> = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "super" => {
                    let mut m = module.clone();
                    let mut rest = &path[..];
                    while rest.first().map(String::as_str) == Some("super") {
                        m.pop();
                        rest = &rest[1..];
                    }
                    m.extend(rest.iter().cloned());
                    m
                }
                _ => continue,
            };
            if abs.is_empty() {
                continue;
            }
            // `crate::x` where x is declared by the crate root.
            if path[0] == "crate" && abs.len() == 1 {
                abs.push(String::new());
            }
            if let Some(to) = resolve(&abs)
                && &to != rel
                && !family(&module, &module_of(&to))
            {
                edges.entry((rel.clone(), to)).or_default().push(line);
            }
        }
    }
    Graph {
        files: files.into_keys().collect(),
        edges,
    }
}

/// Whether modules `a` and `b` are one's ancestor of the other's.
fn family(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(root, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.insert(rel, std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// The cycles of `g` (strongly connected components of more than one
/// file), each with the edges inside it.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    // Tarjan, iterative enough for a few hundred files.
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let succ: Vec<&'a str> =
            t.g.edges
                .keys()
                .filter(|(a, _)| a == v)
                .map(|(_, b)| b.as_str())
                .collect();
        for w in succ {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in &g.files {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn describe(g: &Graph, comp: &[String]) -> String {
    let mut s = format!("{} files: {}\n", comp.len(), comp.join(", "));
    for ((a, b), lines) in &g.edges {
        if comp.contains(a) && comp.contains(b) {
            s += &format!("    {a}:{} -> {b}\n", lines[0]);
        }
    }
    s
}

#[test]
fn no_import_cycle_between_files() {
    let mut bad = String::new();
    for dir in ["daemon/src", "client/src", "adapters/dap/src", "proto/src"] {
        let g = graph(&repo().join(dir));
        for comp in cycles(&g) {
            bad += &format!("{dir}: {}", describe(&g, &comp));
        }
    }
    assert!(bad.is_empty(), "import cycles between files:\n{bad}");
}

fn layer_of(rel: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, prefixes)| prefixes.iter().any(|p| rel.starts_with(p)))
}

#[test]
fn no_file_imports_from_a_layer_above_its_own() {
    let g = graph(&repo().join("daemon/src"));
    let mut bad = Vec::new();
    for f in &g.files {
        assert!(
            layer_of(f).is_some(),
            "daemon/src/{f} is in no layer of this test's LAYERS: say where it belongs"
        );
    }
    for ((a, b), lines) in &g.edges {
        let (la, lb) = (layer_of(a).unwrap(), layer_of(b).unwrap());
        if lb > la && !ALLOWED.iter().any(|(x, y, _)| x == a && y == b) {
            bad.push(format!(
                "daemon/src/{a}:{} ({}) imports daemon/src/{b} ({})",
                lines[0], LAYERS[la].0, LAYERS[lb].0
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "imports from a layer above (allow one by name in ALLOWED, saying why, or move the \
         type down):\n{}",
        bad.join("\n")
    );
}

/// The resolution on a few known lines, so that the rules above cannot
/// pass by resolving nothing.
#[test]
fn paths_resolve_to_their_files() {
    let g = graph(&repo().join("daemon/src"));
    for (a, b) in [
        ("engine/mod.rs", "ledger/mod.rs"),
        ("rpc/mod.rs", "service/mod.rs"),
        ("service/watch.rs", "engine/mod.rs"),
        ("backend/ptrace/code.rs", "bpf/mod.rs"),
        ("backend/ptrace/code.rs", "backend/ptrace/signal_bp.rs"),
    ] {
        assert!(
            g.edges.contains_key(&(a.to_string(), b.to_string())),
            "no edge {a} -> {b}"
        );
    }
    assert_eq!(
        expand("crate::{a::{b, c::D}, e as f}"),
        vec![
            vec!["crate", "a", "b"],
            vec!["crate", "a", "c", "D"],
            vec!["crate", "e"],
        ]
    );
}

/// The layers as the imports draw them, top first: each layer with its
/// files, and the layers below whose files its files import.
fn drawn_layers(g: &Graph) -> String {
    let mut uses: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); LAYERS.len()];
    for (a, b) in g.edges.keys() {
        let (la, lb) = (layer_of(a).unwrap(), layer_of(b).unwrap());
        if la != lb {
            uses[la].insert(lb);
        }
    }
    let mut out = String::new();
    for (i, (name, files)) in LAYERS.iter().enumerate().rev() {
        let mut line = format!("{name}:");
        for f in files.iter() {
            if line.len() + 1 + f.len() > 76 {
                out += &format!("{line}\n");
                line = String::from("   ");
            }
            line += &format!(" {f}");
        }
        out += &format!("{line}\n");
        let below: Vec<&str> = uses[i].iter().rev().map(|&l| LAYERS[l].0).collect();
        if !below.is_empty() {
            let mut line = String::from("  uses");
            for (n, b) in below.iter().enumerate() {
                let sep = if n == 0 { " " } else { ", " };
                if line.len() + sep.len() + b.len() > 76 {
                    out += &format!("{},\n", line.trim_end_matches(", "));
                    line = format!("    {b}");
                } else {
                    line += &format!("{sep}{b}");
                }
            }
            out += &format!("{line}\n");
        }
    }
    out
}

/// ARCHITECTURE.md's ground plan is the one the imports draw: the block
/// after its `<!-- layers -->` mark is exactly [`drawn_layers`] (the
/// failure prints it, to paste in).
#[test]
fn the_architecture_documents_draw_the_layers_from_the_imports() {
    let g = graph(&repo().join("daemon/src"));
    let drawn = drawn_layers(&g);
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let block = doc
        .split_once("<!-- layers -->\n```\n")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(b, _)| b);
    assert_eq!(
        block,
        Some(drawn.as_str()),
        "ARCHITECTURE.md's layers block (after `<!-- layers -->`, in a fence) differs from the \
         imports; as drawn from them:\n{drawn}"
    );
}

/// The documents whose file names are checked: the ground plan and the
/// documents that say which test shows what. (docs/benchmarks.md is a
/// record: its sections name the files as they were at each run.)
const DOCS: &[&str] = &[
    "ARCHITECTURE.md",
    "README.md",
    "docs/kernel-facts.md",
    "docs/reliability.md",
    "docs/security.md",
];

/// Every file or directory the [`DOCS`] name in backticks (`a/b.rs`,
/// `dir/`, `x.rs::item`) exists: with a slash, under the repository root
/// or one of the crates' roots; a bare file name, somewhere in the tree.
#[test]
fn the_documents_name_only_files_that_exist() {
    let root = repo();
    let bases = [
        "",
        "daemon/",
        "daemon/src/",
        "client/",
        "client/src/",
        "adapters/dap/",
        "adapters/dap/src/",
        "tests/",
        "tests/src/",
        "tests/src/bin/",
        "proto/",
        "deploy/",
        // Within a section, names relative to its directory.
        "daemon/src/arch/",
        "daemon/src/backend/",
        "daemon/src/backend/perf/",
        "daemon/src/engine/",
        "daemon/src/rpc/",
        "daemon/src/symbols/",
        "client/tests/cli/",
        "tests/e2e/",
    ];
    let mut names = BTreeSet::new();
    let mut all = Vec::new();
    for dir in [
        "daemon", "client", "adapters", "tests", "proto", "deploy", "scripts", "docs",
    ] {
        walk(&root.join(dir), &mut all);
    }
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        all.push(e.path());
    }
    for p in &all {
        if let Some(n) = p.file_name() {
            names.insert(n.to_string_lossy().to_string());
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc_name in DOCS {
        let doc = std::fs::read_to_string(root.join(doc_name)).unwrap();
        for (n, line) in doc.lines().enumerate() {
            for (i, tok) in line.split('`').enumerate() {
                if i % 2 == 0 || tok.contains(|c: char| " <>*{}$|".contains(c)) {
                    continue;
                }
                let tok = tok.split("::").next().unwrap();
                let is_file = [".rs", ".proto", ".mjs", ".toml", ".md", ".yaml", ".service"]
                    .iter()
                    .any(|x| tok.ends_with(x));
                let is_dir = tok.ends_with('/') && tok.len() > 1 && !tok.starts_with('/');
                if !(is_file || is_dir) || tok.starts_with(['/', '.']) || tok.contains("://") {
                    continue;
                }
                checked += 1;
                let found = if tok.contains('/') {
                    bases
                        .iter()
                        .any(|b| root.join(format!("{b}{tok}")).exists())
                } else {
                    names.contains(tok)
                };
                if !found {
                    missing.push(format!("{doc_name}:{}: `{tok}`", n + 1));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} names checked: the reading is broken"
    );
    assert!(
        missing.is_empty(),
        "names of files that do not exist:\n{}",
        missing.join("\n")
    );
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name == "node_modules" || name == ".git" {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        }
        out.push(p);
    }
}
