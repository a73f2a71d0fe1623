//! Whether a process's large `memset`s will lose the CPU's fast strings
//! once a data breakpoint is armed in it (kernel-facts §14).
//!
//! While any data breakpoint is enabled in a thread, `rep stosb` and
//! `rep movsb` run without fast-string mode. glibc's `memset` switches to
//! `rep stosb` from `glibc.cpu.x86_rep_stosb_threshold` bytes (2 KiB by
//! default), so a program clearing large buffers (libFuzzer clears its
//! counters at every input) slows down by tens of times whatever address is
//! watched. The threshold is read once, by the dynamic loader at the
//! program's start, from `GLIBC_TUNABLES`: the daemon cannot change it for a
//! running process, only tell the person arming the first watchpoint how to
//! start it next time.

use std::sync::LazyLock;

use crate::model::Pid;

/// The tunable that keeps glibc's `memset` on vector stores.
pub const STOSB_TUNABLE: &str = "glibc.cpu.x86_rep_stosb_threshold";

/// A threshold at or above this many bytes keeps `rep stosb` out of any
/// realistic `memset` (the fuzzing guide sets 10^12).
pub const OUT_OF_REACH: u64 = 1 << 30;

/// The setting the warning recommends.
pub const RECOMMENDED: &str = "GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000000";

/// Whether this CPU has enhanced `rep movsb/stosb` (`erms`) or fast short
/// `rep mov` (`fsrm`), the modes an armed breakpoint turns off. Without
/// either, string instructions are no faster unwatched and glibc does not
/// pick them for large sizes.
pub fn cpu_has_fast_strings() -> bool {
    static FAST: LazyLock<bool> = LazyLock::new(|| {
        std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| cpuinfo_has_fast_strings(&s))
            .unwrap_or(false)
    });
    *FAST
}

/// `erms` or `fsrm` among the `flags` of `/proc/cpuinfo`'s text.
fn cpuinfo_has_fast_strings(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|l| l.strip_prefix("flags"))
        .filter_map(|l| l.split_once(':'))
        .any(|(_, flags)| flags.split_whitespace().any(|f| f == "erms" || f == "fsrm"))
}

/// The value of glibc tunable `name` in an environment block (`NUL`
/// separated `KEY=VALUE` entries, as `/proc/PID/environ` gives it), parsed
/// as the loader does: decimal, or hexadecimal after `0x`. The loader reads
/// the first `GLIBC_TUNABLES` entry; within it the last setting counts.
pub fn tunable(environ: &[u8], name: &str) -> Option<u64> {
    let entry = environ
        .split(|&b| b == 0)
        .find_map(|e| e.strip_prefix(b"GLIBC_TUNABLES="))?;
    let entry = std::str::from_utf8(entry).ok()?;
    entry
        .split(':')
        .rev()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == name)
        .find_map(|(_, v)| parse_number(v))
}

fn parse_number(v: &str) -> Option<u64> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Whether a process's mappings (`/proc/PID/maps` text) include glibc's C
/// library, whose `memset` the tunable governs (a static or non-glibc
/// program is not judged).
fn maps_glibc(maps: &str) -> bool {
    maps.lines().any(|l| {
        l.rsplit('/')
            .next()
            .is_some_and(|f| f.starts_with("libc.so.6") || f.starts_with("libc-2."))
    })
}

/// The judgement on facts already read: `Some(threshold now)` when the
/// warning applies.
fn judge(fast_cpu: bool, maps: &str, environ: &[u8]) -> Option<Option<u64>> {
    if !fast_cpu || !maps_glibc(maps) {
        return None;
    }
    match tunable(environ, STOSB_TUNABLE) {
        Some(t) if t >= OUT_OF_REACH => None,
        t => Some(t),
    }
}

/// The warning for the first watchpoint armed in `pid`, when its glibc's
/// `memset` will use `rep stosb` and so slow down while armed. `None` when
/// it will not, or when the process's memory map or environment cannot be
/// read.
pub fn memset_warning(pid: Pid) -> Option<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let now = judge(cpu_has_fast_strings(), &maps, &environ)?;
    let from = now.map_or_else(|| "2 KiB".to_string(), |t| format!("{t} bytes"));
    Some(format!(
        "process {pid}'s memset of {from} and more uses `rep stosb`, which runs many times \
         slower while any data breakpoint is armed (a 64 KiB memset: about 40×); start the \
         program with {RECOMMENDED} to keep memset on vector stores"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GLIBC_MAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 fd:01 123 /usr/bin/target
7f0000000000-7f0000028000 r--p 00000000 fd:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000100000-7f0000101000 r--p 00000000 fd:01 789 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
";

    #[test]
    fn tunables_are_read_as_the_loader_reads_them() {
        let env = b"PATH=/bin\0GLIBC_TUNABLES=glibc.malloc.check=0:glibc.cpu.x86_rep_stosb_threshold=0x100000\0HOME=/\0";
        assert_eq!(tunable(env, STOSB_TUNABLE), Some(0x100000));
        let env = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000000\0";
        assert_eq!(tunable(env, STOSB_TUNABLE), Some(1_000_000_000_000));
        // The last setting in the entry counts; other tunables are not it.
        let env = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=5:glibc.cpu.x86_rep_stosb_threshold=7\0";
        assert_eq!(tunable(env, STOSB_TUNABLE), Some(7));
        let env = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=99\0";
        assert_eq!(tunable(env, STOSB_TUNABLE), None);
        assert_eq!(tunable(b"A=1\0B=2\0", STOSB_TUNABLE), None);
        // Not a number: as if unset.
        let env = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=lots\0";
        assert_eq!(tunable(env, STOSB_TUNABLE), None);
    }

    #[test]
    fn the_warning_needs_a_fast_cpu_glibc_and_a_reachable_threshold() {
        let none = b"PATH=/bin\0";
        assert_eq!(judge(true, GLIBC_MAPS, none), Some(None));
        assert_eq!(judge(false, GLIBC_MAPS, none), None, "no erms/fsrm");
        let static_maps = "55d0c0000000-55d0c0001000 r--p 00000000 fd:01 1 /usr/bin/static\n";
        assert_eq!(judge(true, static_maps, none), None, "no glibc mapped");
        let high = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000000\0";
        assert_eq!(judge(true, GLIBC_MAPS, high), None);
        let low = b"GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=4096\0";
        assert_eq!(judge(true, GLIBC_MAPS, low), Some(Some(4096)));
    }

    #[test]
    fn cpu_flags_are_read_from_the_flags_line() {
        let erms = "processor\t: 0\nflags\t\t: fpu vme erms avx2\nbugs\t\t: sysret_ss_attrs\n";
        assert!(cpuinfo_has_fast_strings(erms));
        let fsrm = "flags\t\t: fpu fsrm\n";
        assert!(cpuinfo_has_fast_strings(fsrm));
        let neither = "flags\t\t: fpu vme ermsx\nmodel name\t: erms\n";
        assert!(!cpuinfo_has_fast_strings(neither));
    }
}
