//! The coverage map a fuzzer reads for a process's executions, found from
//! outside: where state feedback has to land to count as coverage for the
//! input that made the store (kernel-facts §24).
//!
//! - AFL++ (`afl-cc`, every instrumentation mode): the runtime's
//!   `__afl_area_ptr` points at the map and `__afl_map_size` says how many
//!   of its bytes afl-fuzz reads. Under afl-fuzz the pointer is switched, by
//!   the runtime's constructors before `main` and before the fork server
//!   answers, to the fuzzer's System V shared memory segment; outside it,
//!   at the binary's own placeholder (`__afl_area_initial`, private
//!   memory). So a map in a shared segment is the fuzzer's, and one in
//!   private memory says the process is not running under afl-fuzz.
//! - libFuzzer (`-fsanitize=fuzzer`): the inline 8-bit counters, the
//!   executable's `__sancov_cntrs` section (its bounds are symbols only
//!   until it is linked), which libFuzzer, running in the same process,
//!   reads after each input. Counters of instrumented libraries are not
//!   looked for.
//!
//! The pointer is the program's own memory: a program that corrupted it
//! must not steer a write of the daemon's. A map is accepted only when the
//! whole of it lies in one mapping of the expected kind, read again each
//! time it is found.

use super::Symbols;
use crate::model::Pid;

/// A fuzzer's map in one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FuzzerMap {
    /// AFL++'s map: `size` bytes at `base`, in the System V segment
    /// `segment` (the start and end of its mapping).
    Afl {
        /// Where `__afl_area_ptr` is (its value is `base`).
        pointer_at: u64,
        /// The map's first byte.
        base: u64,
        /// Bytes afl-fuzz reads (`__afl_map_size`).
        size: u64,
        /// The shared mapping holding the map.
        segment: (u64, u64),
    },
    /// libFuzzer's inline 8-bit counters: `size` bytes at `base`.
    LibFuzzer {
        /// The counters' first byte.
        base: u64,
        /// Their number (bytes).
        size: u64,
    },
}

impl FuzzerMap {
    /// The map's bytes: first and one past the last.
    pub fn bytes(&self) -> (u64, u64) {
        match *self {
            FuzzerMap::Afl { base, size, .. } | FuzzerMap::LibFuzzer { base, size } => {
                (base, base + size)
            }
        }
    }

    /// The fuzzer's name, for messages.
    pub fn fuzzer(&self) -> &'static str {
        match self {
            FuzzerMap::Afl { .. } => "AFL++",
            FuzzerMap::LibFuzzer { .. } => "libFuzzer",
        }
    }
}

/// Why a process has no fuzzer's map to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFuzzerMap {
    /// Neither AFL++'s runtime nor libFuzzer's counters are in the program.
    #[error(
        "process {pid} was not built for a fuzzer: no AFL++ runtime (__afl_area_ptr, from \
         afl-cc) and no libFuzzer target with counters (LLVMFuzzerTestOneInput and a \
         __sancov_cntrs section, from -fsanitize=fuzzer)"
    )]
    NotInstrumented {
        /// The process.
        pid: Pid,
    },
    /// An AFL++ target running outside afl-fuzz: its map is the binary's
    /// own placeholder, which no fuzzer reads.
    #[error(
        "process {pid} is an AFL++ target not running under afl-fuzz (its map is the \
         program's own placeholder at {base:#x}, which no fuzzer reads): start it with \
         afl-fuzz, or set the watch as a policy that waits for it (--comm, --exe)"
    )]
    NotUnderFuzzer {
        /// The process.
        pid: Pid,
        /// Where its map pointer points.
        base: u64,
    },
    /// The map pointer or size does not describe a fuzzer's map: the
    /// program overwrote them, or its runtime is one this does not know.
    #[error(
        "process {pid}'s AFL++ map is not where a fuzzer's map can be ({why}): nothing will be \
         written through it"
    )]
    Implausible {
        /// The process.
        pid: Pid,
        /// What was found.
        why: String,
    },
    /// The process's memory or mappings could not be read.
    #[error("process {pid}'s fuzzer map cannot be read: {why}")]
    Unreadable {
        /// The process.
        pid: Pid,
        /// Why.
        why: String,
    },
}

/// The largest map believed: AFL++'s own limit for a map size sent in the
/// fork server's handshake (`FS_OPT_MAX_MAPSIZE`, 2^30 bytes).
const MAX_MAP: u64 = 1 << 30;

/// Finds the map of the fuzzer running `pid`, checking that it lies where
/// a fuzzer's map does.
pub fn find(symbols: &Symbols, pid: Pid) -> Result<FuzzerMap, NoFuzzerMap> {
    // The runtime is linked into the program: its symbols are looked up
    // there first (a fork server found after its exec has every library
    // mapped, and a lookup in the whole process would index their DWARF).
    let address = |name: &str| {
        symbols.exe_symbol(pid, name).or_else(|| {
            symbols
                .resolve(pid, name, crate::model::Access::Write, 0)
                .ok()
                .map(|r| r.address)
        })
    };
    if let Some(pointer_at) = address("__afl_area_ptr") {
        let size_at = address("__afl_map_size").ok_or_else(|| NoFuzzerMap::Implausible {
            pid,
            why: "__afl_area_ptr without __afl_map_size".into(),
        })?;
        let read = |at: u64, len: usize| {
            crate::procfs::live_thread(pid)
                .ok_or_else(|| "the process has no live thread".to_string())
                .and_then(|via| crate::procfs::read_memory(pid, via, at, len))
                .map_err(|why| NoFuzzerMap::Unreadable { pid, why })
        };
        let base = u64::from_le_bytes(read(pointer_at, 8)?.try_into().unwrap_or_default());
        let size = u64::from(u32::from_le_bytes(
            read(size_at, 4)?.try_into().unwrap_or_default(),
        ));
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
            NoFuzzerMap::Unreadable {
                pid,
                why: e.to_string(),
            }
        })?;
        let placeholder = address("__afl_area_initial");
        return judge_afl(pid, pointer_at, base, size, placeholder, &maps);
    }
    if let Some((base, size)) = symbols.exe_section(pid, "__sancov_cntrs")
        && size > 0
        && symbols
            .resolve(pid, "LLVMFuzzerTestOneInput", crate::model::Access::Exec, 0)
            .is_ok()
    {
        return Ok(FuzzerMap::LibFuzzer { base, size });
    }
    Err(NoFuzzerMap::NotInstrumented { pid })
}

/// The shared segment (its start and end) holding `size` bytes at `base`
/// in process `pid`, judged as an AFL++ map is: where the map of a program
/// without the runtime's symbols is known only by the address afl-fuzz's
/// segment was attached at.
pub fn afl_segment(pid: Pid, base: u64, size: u64) -> Result<(u64, u64), NoFuzzerMap> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| {
        NoFuzzerMap::Unreadable {
            pid,
            why: e.to_string(),
        }
    })?;
    Ok(match judge_afl(pid, 0, base, size, None, &maps)? {
        FuzzerMap::Afl { segment, .. } => segment,
        other => other.bytes(),
    })
}

/// The AFL++ map at `base` of `size` bytes, judged against the process's
/// mappings (`/proc/PID/maps` text): the whole map in one writable shared
/// memory segment (System V, or POSIX under `/dev/shm` for a runtime built
/// to use those). `placeholder`: where the binary's own placeholder map is
/// (`__afl_area_initial`), if found.
fn judge_afl(
    pid: Pid,
    pointer_at: u64,
    base: u64,
    size: u64,
    placeholder: Option<u64>,
    maps: &str,
) -> Result<FuzzerMap, NoFuzzerMap> {
    let implausible = |why: String| Err(NoFuzzerMap::Implausible { pid, why });
    if placeholder == Some(base) {
        return Err(NoFuzzerMap::NotUnderFuzzer { pid, base });
    }
    if size == 0 || size > MAX_MAP {
        return implausible(format!("a map size of {size} bytes"));
    }
    let Some(m) = maps
        .lines()
        .filter_map(Mapping::parse)
        .find(|m| m.contains(base))
    else {
        return implausible(format!("the map pointer {base:#x} points into no mapping"));
    };
    if !(m.path.starts_with("/SYSV") || m.path.starts_with("/dev/shm/")) {
        // A pointer into the program's files, its stack or its heap: the
        // program overwrote it.
        return implausible(format!(
            "the map pointer {base:#x} points into {} ({}), not a shared memory segment",
            if m.path.is_empty() {
                "anonymous memory"
            } else {
                m.path
            },
            m.perms
        ));
    }
    if !(m.perms.starts_with("rw") && m.perms.ends_with('s')) {
        return implausible(format!(
            "the shared memory segment at {:#x} is mapped {}, not rw-s",
            m.start, m.perms
        ));
    }
    if base.checked_add(size).is_none_or(|end| end > m.end) {
        return implausible(format!(
            "{size} bytes from {base:#x} run past the segment's end at {:#x}",
            m.end
        ));
    }
    Ok(FuzzerMap::Afl {
        pointer_at,
        base,
        size,
        segment: (m.start, m.end),
    })
}

/// One line of `/proc/PID/maps`.
struct Mapping<'a> {
    start: u64,
    end: u64,
    perms: &'a str,
    path: &'a str,
}

impl<'a> Mapping<'a> {
    fn parse(line: &'a str) -> Option<Mapping<'a>> {
        let mut f = line.splitn(6, ' ');
        let (lo, hi) = f.next()?.split_once('-')?;
        let perms = f.next()?;
        let path = f.nth(3).unwrap_or("").trim_start();
        Some(Mapping {
            start: u64::from_str_radix(lo, 16).ok()?,
            end: u64::from_str_radix(hi, 16).ok()?,
            perms,
            path,
        })
    }

    fn contains(&self, at: u64) -> bool {
        (self.start..self.end).contains(&at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234                       /tmp/maze
55d0c0c00000-55d0c0e01000 rw-p 00000000 00:00 0 
7f1eadc67000-7f1eae467000 rw-s 00000000 00:01 32769                      /SYSV00000000 (deleted)
7f1eae500000-7f1eae501000 r--s 00000000 00:01 32770                      /SYSV00000001 (deleted)
7f1eae600000-7f1eae700000 rw-s 00000000 08:01 99                         /tmp/shared.bin
";

    #[test]
    fn a_map_in_a_writable_shared_segment_is_the_fuzzers() {
        let m = judge_afl(7, 0x10, 0x7f1eadc67000, 11, None, MAPS).unwrap();
        assert_eq!(m.bytes(), (0x7f1eadc67000, 0x7f1eadc67000 + 11));
        assert_eq!(
            m,
            FuzzerMap::Afl {
                pointer_at: 0x10,
                base: 0x7f1eadc67000,
                size: 11,
                segment: (0x7f1eadc67000, 0x7f1eae467000),
            }
        );
    }

    #[test]
    fn the_programs_own_placeholder_means_no_fuzzer() {
        assert_eq!(
            judge_afl(7, 0x10, 0x55d0c0c00100, 11, Some(0x55d0c0c00100), MAPS),
            Err(NoFuzzerMap::NotUnderFuzzer {
                pid: 7,
                base: 0x55d0c0c00100
            })
        );
    }

    #[test]
    fn a_corrupted_pointer_or_size_is_caught() {
        let why = |r: Result<FuzzerMap, NoFuzzerMap>| match r {
            Err(NoFuzzerMap::Implausible { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        const P: Option<u64> = Some(0x55d0c0c00100);
        // Nowhere; into the heap (the placeholder is elsewhere).
        assert!(why(judge_afl(7, 0, 0x1000, 11, P, MAPS)).contains("no mapping"));
        assert!(why(judge_afl(7, 0, 0x55d0c0c00200, 11, P, MAPS)).contains("anonymous memory"));
        // Into the program's code, a read-only segment, a shared file.
        assert!(why(judge_afl(7, 0, 0x55d0c0a00010, 11, P, MAPS)).contains("/tmp/maze"));
        assert!(why(judge_afl(7, 0, 0x7f1eae500000, 11, P, MAPS)).contains("r--s"));
        assert!(why(judge_afl(7, 0, 0x7f1eae600000, 11, P, MAPS)).contains("/tmp/shared.bin"));
        // A size running past the segment, or absurd.
        assert!(why(judge_afl(7, 0, 0x7f1eae467000 - 4, 11, P, MAPS)).contains("past"));
        assert!(why(judge_afl(7, 0, 0x7f1eadc67000, 0, P, MAPS)).contains("map size"));
        assert!(why(judge_afl(7, 0, 0x7f1eadc67000, 1 << 31, P, MAPS)).contains("map size"));
    }
}
