//! `fuzzmap::find` against the real fuzzers (AFL++ and libFuzzer from
//! Debian's packages) and targets built here with their compilers:
//! - an `afl-cc` target's fork server under `afl-fuzz`: the map found is in
//!   the System V segment whose id afl-fuzz gave the target
//!   (`__AFL_SHM_ID`), as big as the map the target reports;
//! - the same program outside afl-fuzz: not under a fuzzer (its map is its
//!   own placeholder), and with its map pointer overwritten to point into
//!   its heap: caught, not followed;
//! - a `-fsanitize=fuzzer` target fuzzing: its inline counters, as many as
//!   libFuzzer says it loaded;
//! - a program built with plain `cc`: not built for a fuzzer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wpd::symbols::Symbols;
use wpd::symbols::fuzzmap::{self, FuzzerMap, NoFuzzerMap};

/// Reads one input from stdin and branches on it; with `corrupt`, first
/// points AFL++'s map pointer into its heap; run with an argument, waits
/// for stdin to close (so a test can look at it).
const AFL_TARGET: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[64];
    /* Found at run time: the instrumentation rewrites a reference to the
       runtime's own variable in the program's source. */
    unsigned char **area = dlsym(RTLD_DEFAULT, "__afl_area_ptr");
    if (argc > 1 && strcmp(argv[1], "corrupt") == 0 && area)
        *area = malloc(1 << 16);
    ssize_t n = read(0, buf, sizeof buf);
    if (n > 1 && buf[0] == 'w' && buf[1] == 'p')
        return 2;
    while (argc > 1 && read(0, buf, sizeof buf) > 0) {}
    return 0;
}
"#;

/// A libFuzzer target.
const LIBFUZZER_TARGET: &str = r#"
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n > 2 && d[0] == 'w' && d[1] == 'p' && d[2] == 'd')
        return 1;
    return 0;
}
"#;

/// A child stopped and reaped when dropped: asked with SIGTERM first (afl-fuzz
/// then stops its fork server and removes its shared memory segments; killed,
/// it leaves them to the kernel until reboot), killed if it has not ended
/// within 10 s.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this guard owns, not yet reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The System V shared memory segments process `pid` created that are
/// still there.
fn segments_created_by(pid: u32) -> Vec<String> {
    std::fs::read_to_string("/proc/sysvipc/shm")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(4) == Some(pid.to_string().as_str()))
        .map(str::to_string)
        .collect()
}

/// A directory of its own under the temporary directory, removed when
/// dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("wpd-fuzzmap-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn build(dir: &Path, compiler: &str, flags: &[&str], source: &str, name: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let out = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// `exe ARGS`, its stdin a pipe held open (it waits there).
fn waiting(exe: &Path, args: &[&str]) -> Guard {
    Guard(
        Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Polls `find` until it gives what `done` accepts (the runtime switches
/// its pointer in its constructors, a moment after the exec), for 30 s.
fn find_when(pid: i32, done: impl Fn(&Result<FuzzerMap, NoFuzzerMap>) -> bool) -> FuzzResult {
    let symbols = Symbols::new();
    let start = Instant::now();
    loop {
        let r = fuzzmap::find(&symbols, pid);
        if done(&r) || start.elapsed() > Duration::from_secs(30) {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

type FuzzResult = Result<FuzzerMap, NoFuzzerMap>;

/// The children of `parent` running `exe`.
fn children_running(parent: u32, exe: &Path) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent)
            && std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .as_deref()
                == Some(exe)
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn afl_fork_servers_map_is_afl_fuzzs_segment() {
    let dir = Dir::new("afl");
    let exe = build(&dir.0, "afl-cc", &["-O1", "-g"], AFL_TARGET, "fmtarget");
    let input = dir.0.join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("seed"), b"hello").unwrap();
    let afl = Guard(
        Command::new("afl-fuzz")
            .arg("-i")
            .arg(&input)
            .arg("-o")
            .arg(dir.0.join("out"))
            .args(["-V", "60", "--"])
            .arg(&exe)
            .envs([
                ("AFL_NO_UI", "1"),
                ("AFL_SKIP_CPUFREQ", "1"),
                ("AFL_NO_AFFINITY", "1"),
                ("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("afl-fuzz"),
    );
    let start = Instant::now();
    let server = loop {
        // The fork server: afl-fuzz's child running the target (its own
        // children, one per execution, are the fork server's).
        if let Some(&p) = children_running(afl.0.id(), &exe).first() {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no fork server");
        std::thread::sleep(Duration::from_millis(50));
    };
    let found = find_when(server, |r| r.is_ok());
    let Ok(FuzzerMap::Afl {
        base,
        size,
        segment,
        ..
    }) = found
    else {
        panic!("fork server {server}: {found:?}");
    };
    // The segment is the one afl-fuzz made for this target: a System V
    // mapping's inode in /proc/PID/maps is its shm id.
    let environ = std::fs::read(format!("/proc/{server}/environ")).unwrap();
    let shm_id = environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"__AFL_SHM_ID="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("__AFL_SHM_ID in the fork server's environment");
    let maps = std::fs::read_to_string(format!("/proc/{server}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.starts_with(&format!("{:x}-{:x} ", segment.0, segment.1)))
        .expect("the segment in maps");
    assert_eq!(
        line.split_whitespace().nth(4),
        Some(shm_id.as_str()),
        "{line}"
    );
    assert!(line.contains("/SYSV"), "{line}");
    assert!(base >= segment.0 && base + size <= segment.1);
    // As big as the map afl-fuzz reads: the target's edges (a handful
    // here), never the placeholder's 2 MiB.
    assert!((2..4096).contains(&size), "map size {size}");
    // Stopped, afl-fuzz takes its segments with it.
    let pid = afl.0.id();
    drop(afl);
    let left = segments_created_by(pid);
    assert!(left.is_empty(), "afl-fuzz left segments: {left:?}");
}

#[test]
fn outside_afl_fuzz_there_is_no_fuzzers_map_and_a_corrupted_pointer_is_caught() {
    let dir = Dir::new("alone");
    let exe = build(&dir.0, "afl-cc", &["-O1", "-g"], AFL_TARGET, "fmtarget");
    let alone = waiting(&exe, &["wait"]);
    let r = find_when(alone.0.id() as i32, |r| {
        matches!(r, Err(NoFuzzerMap::NotUnderFuzzer { .. }))
    });
    assert!(
        matches!(r, Err(NoFuzzerMap::NotUnderFuzzer { .. })),
        "outside afl-fuzz: {r:?}"
    );
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("not running under afl-fuzz"), "{msg}");
    let corrupt = waiting(&exe, &["corrupt"]);
    let r = find_when(corrupt.0.id() as i32, |r| {
        matches!(r, Err(NoFuzzerMap::Implausible { .. }))
    });
    match &r {
        Err(NoFuzzerMap::Implausible { why, .. }) => {
            assert!(
                why.contains("[heap]") && why.contains("not a shared memory segment"),
                "{why}"
            )
        }
        other => panic!("a map pointer into the heap: {other:?}"),
    }
}

/// The runtime's variables are looked up in the program's own symbol tables: finding the
/// map of a program that maps the C library and the loader (a fork server found after its
/// exec, as a policy by name finds one) loads no module but the program (a lookup in the
/// whole process indexed every library's DWARF first: a second, a C library's debug
/// information installed).
#[test]
fn the_runtime_is_looked_up_in_the_program_alone() {
    let dir = Dir::new("exeonly");
    let exe = build(&dir.0, "afl-cc", &["-O1", "-g"], AFL_TARGET, "fmexe");
    let alone = waiting(&exe, &["wait"]);
    let pid = alone.0.id() as i32;
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let start = Instant::now();
    while !maps().contains("libc.so") && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(maps().contains("libc.so"), "the program never mapped libc");
    let symbols = Symbols::new();
    let r = fuzzmap::find(&symbols, pid);
    assert!(
        matches!(r, Err(NoFuzzerMap::NotUnderFuzzer { .. })),
        "outside afl-fuzz: {r:?}"
    );
    assert_eq!(
        symbols.stats().files,
        1,
        "modules loaded to find the map of a program mapping {} files",
        maps().lines().filter(|l| l.contains(".so")).count()
    );
}

#[test]
fn libfuzzers_counters_are_as_many_as_it_loaded() {
    let dir = Dir::new("libfuzzer");
    let exe = build(
        &dir.0,
        "clang-19",
        &["-g", "-O1", "-fsanitize=fuzzer"],
        LIBFUZZER_TARGET,
        "fmfuzzer",
    );
    let corpus = dir.0.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let log = dir.0.join("log");
    let fuzzer = Guard(
        Command::new(&exe)
            .arg("-max_total_time=60")
            .arg(&corpus)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let r = find_when(fuzzer.0.id() as i32, |r| r.is_ok());
    let Ok(FuzzerMap::LibFuzzer { base, size }) = r else {
        panic!("libFuzzer: {r:?}");
    };
    // "INFO: Loaded 1 modules   (N inline 8-bit counters): ..."
    let start = Instant::now();
    let loaded = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(n) = text.lines().find_map(|l| {
            let (_, rest) = l.split_once("modules")?;
            rest.trim_start()
                .strip_prefix('(')?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        }) {
            break n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "libFuzzer said: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(size, loaded, "counters at {base:#x}");
    drop(fuzzer);
}

#[test]
fn a_program_not_built_for_a_fuzzer_has_no_map() {
    let dir = Dir::new("plain");
    let exe = build(
        &dir.0,
        "cc",
        &["-O1", "-g"],
        "#include <unistd.h>\nint main(void) { char b[8]; while (read(0, b, 8) > 0) {} return 0; }\n",
        "fmplain",
    );
    let plain = waiting(&exe, &[]);
    std::thread::sleep(Duration::from_millis(100));
    let r = fuzzmap::find(&Symbols::new(), plain.0.id() as i32);
    assert!(
        matches!(r, Err(NoFuzzerMap::NotInstrumented { .. })),
        "{r:?}"
    );
}
