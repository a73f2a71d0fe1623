//! State feedback for a fuzzer (kernel-facts §24): which processes can take
//! it, and what a feedback breakpoint's `sig_data` says in one.
//!
//! The map afl-fuzz reads is written by `libwpd_feedback.so`
//! (`feedback/preload`), preloaded into the program: it makes room after
//! the edges in the map (raising `__afl_map_size` before the fork server's
//! handshake) and counts each trap's value there. A BPF program cannot
//! write the program's memory on a kernel locked down for integrity (this
//! project's machines: `bpf_probe_write_user` is refused, §24.1), and the
//! map is only read for as many bytes as the target reports, so the
//! library is what makes it work. The daemon arms a feedback watchpoint in
//! a process only where the library is (or will be, before the program's
//! first instruction) and the process is under afl-fuzz: anywhere else its
//! breakpoint's `SIGTRAP` would have no handler and end the program.

use crate::error::WpdError;
use crate::model::{Access, Pid, WatchSpec};
use crate::procfs;

use super::Core;

/// The library's file name.
pub const LIBRARY: &str = "libwpd_feedback.so";
/// `wpd_feedback_state`'s first word (`feedback/preload`: `MAGIC`).
const MAGIC: u64 = u64::from_le_bytes(*b"wpdfeed1");

/// Where the library is installed, for the messages that tell a user to
/// preload it: beside the daemon's binary (a build's `target/release`),
/// else under `lib/wpd/` of its prefix.
pub fn library_path() -> String {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let dir = exe.as_deref().and_then(std::path::Path::parent);
    if let Some(d) = dir {
        let beside = d.join(LIBRARY);
        if beside.is_file() {
            return beside.display().to_string();
        }
        if let Some(prefix) = d.parent() {
            return prefix.join("lib/wpd").join(LIBRARY).display().to_string();
        }
    }
    format!("/usr/local/lib/wpd/{LIBRARY}")
}

/// The environment a process started with (`/proc/PID/environ`): the
/// value of `name`, if set.
fn environ_var(pid: Pid, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let rest = kv.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(rest).into_owned())
    })
}

/// Whether an `LD_PRELOAD` value (paths separated by colons or spaces, as
/// the loader reads it) names the library.
fn preloads_library(value: &str) -> bool {
    value
        .split([':', ' '])
        .any(|p| std::path::Path::new(p).file_name() == Some(std::ffi::OsStr::new(LIBRARY)))
}

impl Core {
    /// The `sig_data` of `spec`'s feedback breakpoint in process `pid`
    /// (`tag`: the watchpoint's, or its policy's, id), after checking that
    /// the process can take feedback.
    pub(super) fn feedback_sig_data(&self, spec: &WatchSpec, tag: u64) -> Result<u64, WpdError> {
        let pid = spec.pid;
        let Some(fb) = &spec.feedback else {
            return Err(WpdError::Internal("no feedback asked for".into()));
        };
        let bad = |why: String| WpdError::InvalidArgument(why);
        if spec.access == Access::Exec {
            return Err(bad(
                "feedback counts the values stored: a write or read-write watchpoint".into(),
            ));
        }
        let len = spec.range.len;
        if spec.range.slots() != 1 || !matches!(len, 1 | 2 | 4 | 8) {
            return Err(bad(format!(
                "feedback reads the value at each store: 1, 2, 4 or 8 aligned bytes, not {len} \
                 at {:#x}",
                spec.range.addr
            )));
        }
        self.feedback_reaches(pid)?;
        let with = match &fb.with {
            None => None,
            Some(expr) => {
                let r = self.symbols.resolve(pid, expr, Access::Write, 0)?;
                if !matches!(r.size, 1 | 2 | 4 | 8) || r.address & (r.size - 1) != 0 {
                    return Err(bad(format!(
                        "--feedback-with {expr}: {} bytes at {:#x}; the handler reads 1, 2, 4 or 8 \
                         aligned bytes (name a member, or cast: *(int *)&{expr})",
                        r.size, r.address
                    )));
                }
                Some((r.address, r.size as u8))
            }
        };
        wpd_feedback_key::Trap {
            mode: fb.mode,
            len: len as u8,
            with,
            tag: (tag & 0x7ff) as u16,
        }
        .encode()
        .ok_or_else(|| bad("the other variable's address does not fit the trap's data".into()))
    }

    /// Whether the preloaded library can count feedback in `pid`'s
    /// fuzzer's map: loaded, with its room made (AFL++: under afl-fuzz, in
    /// the segment the program's own map pointer names; libFuzzer: its
    /// counters registered), or, for a process held at its exec, named in
    /// its `LD_PRELOAD` (the loader maps it before the program's first
    /// instruction) with a fuzzer to read the room: afl-fuzz's segment in
    /// its environment, or libFuzzer in the program.
    fn feedback_reaches(&self, pid: Pid) -> Result<(), WpdError> {
        use crate::symbols::fuzzmap::{self, FuzzerMap};
        let no = |why: String| WpdError::NoFeedbackPath(why);
        let found = fuzzmap::find(&self.symbols, pid);
        let libfuzzer = matches!(found, Ok(FuzzerMap::LibFuzzer { .. }));
        let preload = if libfuzzer {
            format!("LD_PRELOAD={}", library_path())
        } else {
            format!("AFL_PRELOAD={}", library_path())
        };
        let under_afl = environ_var(pid, "__AFL_SHM_ID").is_some();
        let not_under = || {
            no(format!(
                "process {pid} is not running under afl-fuzz (no __AFL_SHM_ID) and is not a \
                 libFuzzer target: there is no fuzzer's map to count its values in"
            ))
        };
        let mapped = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map_err(|e| no(format!("process {pid}'s mappings cannot be read: {e}")))?
            .lines()
            .any(|l| l.ends_with(&format!("/{LIBRARY}")));
        if !mapped {
            let named = environ_var(pid, "LD_PRELOAD").is_some_and(|p| preloads_library(&p));
            return match (named, under_afl || libfuzzer) {
                (true, true) => Ok(()),
                (false, _) => Err(no(format!(
                    "process {pid} does not have wpd's feedback library: run the fuzzer with \
                     {preload} ({}; the breakpoint's signal would end a program without it)",
                    if libfuzzer {
                        "it registers counters of its own with libFuzzer and counts each value there"
                    } else {
                        "it makes room in AFL++'s map and counts each value there"
                    }
                ))),
                (true, false) => Err(not_under()),
            };
        }
        let state = self
            .symbols
            .resolve(
                pid,
                &format!("{LIBRARY}:wpd_feedback_state"),
                Access::Write,
                0,
            )
            .map_err(|e| {
                no(format!(
                    "{LIBRARY} in process {pid} has no state to read: {e}"
                ))
            })?;
        let via = procfs::live_thread(pid).ok_or(WpdError::ProcessExited(pid))?;
        let words = procfs::read_memory(pid, via, state.address, 24)
            .map_err(|e| no(format!("{LIBRARY}'s state in process {pid}: {e}")))?;
        let word = |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap());
        let (magic, map, base_room) = (word(0), word(1), word(2));
        let room = base_room >> 32;
        if magic != MAGIC {
            return Err(no(format!(
                "process {pid} has another version of {LIBRARY}: preload the one beside this \
                 daemon ({preload})"
            )));
        }
        if libfuzzer {
            // The room is the library's own counters, registered with
            // libFuzzer by its constructor.
            let counters = self
                .symbols
                .resolve(
                    pid,
                    &format!("{LIBRARY}:wpd_feedback_counters"),
                    Access::Write,
                    0,
                )
                .map_err(|e| no(format!("{LIBRARY} in process {pid}: {e}")))?;
            return if map == 0 || room == 0 {
                Err(no(format!(
                    "{LIBRARY} did not register its counters with libFuzzer in process {pid}: the \
                     program does not export __sanitizer_cov_8bit_counters_init and \
                     __sanitizer_cov_pcs_init, or it runs under afl-fuzz"
                )))
            } else if map != counters.address {
                Err(no(format!(
                    "{LIBRARY}'s room in process {pid} is at {map:#x}, not its counters at {:#x}",
                    counters.address
                )))
            } else {
                Ok(())
            };
        }
        if !under_afl {
            return Err(not_under());
        }
        if map == 0 || room == 0 {
            return Err(no(format!(
                "{LIBRARY} has made no room in process {pid}'s AFL++ map: its fork server has not \
                 shaken hands with afl-fuzz yet, its handshake says no map size, or afl-fuzz's \
                 segment has no bytes to spare"
            )));
        }
        // The program's own map pointer agrees with the segment the
        // library attached; without the runtime's symbols (a stripped
        // program), the room lies in a shared segment (the library writes
        // through the address its shmat returned, never the program's
        // pointer).
        match found {
            Ok(FuzzerMap::Afl { base, .. }) if base == map => Ok(()),
            Err(fuzzmap::NoFuzzerMap::NotInstrumented { .. }) => {
                let end = (base_room & 0xffff_ffff) + room;
                fuzzmap::afl_segment(pid, map, end)
                    .map(|_| ())
                    .map_err(|e| no(e.to_string()))
            }
            Ok(m) => Err(no(format!(
                "process {pid}'s {} map at {:#x} is not the segment {LIBRARY} attached at {map:#x}",
                m.fuzzer(),
                m.bytes().0
            ))),
            Err(e) => Err(no(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_preload_names_the_library_only_as_a_file_of_its_own() {
        assert!(preloads_library("/opt/wpd/libwpd_feedback.so"));
        assert!(preloads_library("/lib/a.so:libwpd_feedback.so /lib/b.so"));
        assert!(!preloads_library("/tmp/libwpd_feedback.so.old"));
        assert!(!preloads_library("/tmp/libwpd_feedback.so/x.so"));
        assert!(!preloads_library("/tmp/not-libwpd_feedback.so"));
        assert!(!preloads_library(""));
    }
}
