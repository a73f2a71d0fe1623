//! Records of the collectors' rings (`PERF_RECORD_*`), decoded for the
//! sample fields wpd asks for (`attr::SAMPLE_TYPE`).

use perf_event_open_sys::bindings as b;

/// A decoded record from a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A breakpoint fired.
    Sample {
        /// Primary event id (the event we opened, also for inherited copies).
        id: u64,
        /// Instruction pointer after the access.
        ip: u64,
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds.
        time: u64,
        /// Configured breakpoint address.
        addr: u64,
        /// CPU.
        cpu: u32,
        /// The user call chain (`PERF_SAMPLE_CALLCHAIN`, breakpoints of
        /// watchpoints asking for a backtrace): return addresses of the
        /// callers, innermost first (the sample's own ip and the kernel's
        /// context markers left out).
        callchain: Vec<u64>,
        /// The user registers after the access (`PERF_SAMPLE_REGS_USER`,
        /// breakpoints on stores), in the order of
        /// [`SAMPLE_MASK`](crate::arch::current::perf_regs::SAMPLE_MASK)'s
        /// bits; `None` when not asked for, or the kernel had none.
        regs: Option<Box<SampledRegs>>,
    },
    /// A breakpoint of the per-thread path fired (its program's record).
    Hit(super::ring::RingHit),
    /// A task was created (thread or process).
    Fork {
        /// Process of the new task.
        pid: i32,
        /// Process of the creator.
        ppid: i32,
        /// New task.
        tid: i32,
        /// Creating thread.
        ptid: i32,
        /// CLOCK_MONOTONIC nanoseconds, emitted after inheritance.
        time: u64,
    },
    /// A task exited.
    Exit {
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds.
        time: u64,
    },
    /// A process called exec (its breakpoints are gone: `remove_on_exec`).
    Exec {
        /// Process.
        pid: i32,
        /// Thread that called exec (now the leader).
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds (from the `sample_id_all` trailer).
        time: u64,
        /// The new program's name.
        name: String,
    },
    /// A thread was renamed (`prctl(PR_SET_NAME)`, `pthread_setname_np`).
    Comm {
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// Its new name.
        name: String,
    },
    /// The kernel dropped records: ring full.
    Lost {
        /// How many.
        count: u64,
    },
    /// The kernel throttled an event (`PERF_RECORD_THROTTLE`): it records
    /// nothing until the next tick. wpd's breakpoints are never throttled
    /// (kernel-facts §10); counted all the same.
    Throttle {
        /// The event's id.
        id: u64,
    },
}

/// The registers of a sample.
pub type SampledRegs = [u64; crate::arch::current::perf_regs::SAMPLED];

/// `PERF_SAMPLE_REGS_ABI_NONE`: the sample has no user registers.
const REGS_ABI_NONE: u64 = 0;

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.0.split_at_checked(8)?;
        self.0 = t;
        Some(u64::from_ne_bytes(h.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_at_checked(4)?;
        self.0 = t;
        Some(u32::from_ne_bytes(h.try_into().ok()?))
    }
}

/// Call-chain entries from this value up are context markers
/// (`PERF_CONTEXT_USER`…), not addresses (`(u64)-4095`, uapi
/// `perf_event.h`).
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

/// Decodes a record body (after the 8-byte header) for our `SAMPLE_TYPE`.
pub fn parse_record(ty: u32, misc: u16, body: &[u8]) -> Option<Record> {
    let mut c = Cursor(body);
    match ty {
        b::PERF_RECORD_SAMPLE => {
            // Order fixed by the ABI: IDENTIFIER, IP, TID, TIME, ADDR, CPU.
            let id = c.u64()?;
            let ip = c.u64()?;
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let time = c.u64()?;
            let addr = c.u64()?;
            let cpu = c.u32()?;
            let _res = c.u32();
            // PERF_SAMPLE_CALLCHAIN, when the event asked for it: the first
            // field after CPU, so present exactly when bytes remain; an
            // event asking for registers asks for a chain too.
            let mut callchain = Vec::new();
            if let Some(nr) = c.u64() {
                let (mut first_user, mut ended) = (true, false);
                // Every entry is read, those kept or not, for the
                // registers after them.
                for _ in 0..nr {
                    let Some(v) = c.u64() else { break };
                    if ended || v >= PERF_CONTEXT_MAX {
                        continue; // PERF_CONTEXT_USER and the like
                    }
                    if std::mem::take(&mut first_user) && v == ip {
                        continue;
                    }
                    // A frame pointer that was not one ends the chain, as
                    // does the cap.
                    ended = v == 0 || callchain.len() == 512;
                    if !ended {
                        callchain.push(v);
                    }
                }
            }
            // PERF_SAMPLE_REGS_USER: the ABI, then the registers unless it
            // is NONE.
            let regs = match c.u64() {
                Some(abi) if abi != REGS_ABI_NONE => {
                    let mut r: SampledRegs = [0; crate::arch::current::perf_regs::SAMPLED];
                    for w in r.iter_mut() {
                        *w = c.u64()?;
                    }
                    Some(Box::new(r))
                }
                _ => None,
            };
            Some(Record::Sample {
                id,
                ip,
                pid,
                tid,
                time,
                addr,
                cpu,
                callchain,
                regs,
            })
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let pid = c.u32()? as i32;
            let ppid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let ptid = c.u32()? as i32;
            let time = c.u64()?;
            if ty == b::PERF_RECORD_FORK {
                Some(Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                })
            } else {
                Some(Record::Exit { pid, tid, time })
            }
        }
        b::PERF_RECORD_COMM => {
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            // The name, NUL-terminated (padded to 8 bytes), then the
            // trailer; at most 16 bytes of name.
            let rest = body.get(8..)?;
            let end = rest.iter().take(16).position(|&b| b == 0)?;
            let name = String::from_utf8_lossy(&rest[..end]).into_owned();
            if u32::from(misc) & b::PERF_RECORD_MISC_COMM_EXEC == 0 {
                return Some(Record::Comm { pid, tid, name });
            }
            // The trailer ends with TID, TIME, CPU and IDENTIFIER (8 bytes
            // each): the time is the third u64 from the end.
            let at = body.len().checked_sub(24)?;
            let time = u64::from_ne_bytes(body.get(at..at + 8)?.try_into().ok()?);
            Some(Record::Exec {
                pid,
                tid,
                time,
                name,
            })
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            let count = c.u64()?;
            Some(Record::Lost { count })
        }
        b::PERF_RECORD_THROTTLE => {
            let _time = c.u64()?;
            let id = c.u64()?;
            Some(Record::Throttle { id })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn a_throttle_names_its_event() {
        // time, id, stream id, then the sample_id_all trailer.
        let body = bytes(&[1234, 42, 42, 5, 1234, 0, 42]);
        assert_eq!(
            parse_record(b::PERF_RECORD_THROTTLE, 0, &body),
            Some(Record::Throttle { id: 42 })
        );
        assert_eq!(parse_record(b::PERF_RECORD_UNTHROTTLE, 0, &body), None);
    }

    #[test]
    fn parses_sample_in_abi_order() {
        let pidtid = (7u64 << 32) | 5; // pid 5, tid 7 (little-endian u32 pair)
        let body = bytes(&[42, 0x401000, pidtid, 1234, 0x5000, 1]);
        assert_eq!(
            parse_record(b::PERF_RECORD_SAMPLE, 0, &body),
            Some(Record::Sample {
                id: 42,
                ip: 0x401000,
                pid: 5,
                tid: 7,
                time: 1234,
                addr: 0x5000,
                cpu: 1,
                callchain: vec![],
                regs: None,
            })
        );
    }

    #[test]
    fn parses_a_stores_sample_its_chain_then_its_registers() {
        use crate::arch::current::perf_regs::SAMPLED;
        let pidtid = (7u64 << 32) | 5;
        let user = (-512i64) as u64; // PERF_CONTEXT_USER
        let regs: Vec<u64> = (100..100 + SAMPLED as u64).collect();
        // The sample's chain and registers, `tail` after its fixed fields.
        let read = |tail: &[u64]| {
            let mut words = vec![42, 0x401000, pidtid, 1234, 0x5000, 1];
            words.extend(tail);
            match parse_record(b::PERF_RECORD_SAMPLE, 0, &bytes(&words)) {
                Some(Record::Sample {
                    callchain, regs, ..
                }) => (callchain, regs.map(|r| r.to_vec())),
                other => panic!("not a sample: {other:?}"),
            }
        };
        // The chain of the ip alone (no caller asked for); ABI 64-bit (2).
        let tail: Vec<u64> = [2, user, 0x401000, 2]
            .into_iter()
            .chain(regs.clone())
            .collect();
        assert_eq!(read(&tail), (vec![], Some(regs.clone())));
        // A chain ended early by a zero frame: its entries are all read.
        let tail: Vec<u64> = [4, user, 0x401000, 0, 7, 2]
            .into_iter()
            .chain(regs.clone())
            .collect();
        assert_eq!(read(&tail), (vec![], Some(regs)));
        // ABI NONE: no registers follow.
        assert_eq!(read(&[0, 0]), (vec![], None));
    }

    #[test]
    fn parses_a_sample_with_its_user_call_chain() {
        let pidtid = (7u64 << 32) | 5;
        let user = (-512i64) as u64; // PERF_CONTEXT_USER
        let body = bytes(&[
            42, 0x401000, pidtid, 1234, 0x5000, 1, 4, user, 0x401000, 0x402222, 0x403333,
        ]);
        let Some(Record::Sample { callchain, .. }) = parse_record(b::PERF_RECORD_SAMPLE, 0, &body)
        else {
            panic!("not a sample");
        };
        assert_eq!(
            callchain,
            vec![0x402222, 0x403333],
            "the marker and the ip left out"
        );
    }

    #[test]
    fn parses_fork_and_exit() {
        let body = bytes(&[(5u64 << 32) | 5, (5u64 << 32) | 9, 777]);
        assert_eq!(
            parse_record(b::PERF_RECORD_FORK, 0, &body),
            Some(Record::Fork {
                pid: 5,
                ppid: 5,
                tid: 9,
                ptid: 5,
                time: 777
            })
        );
        assert!(matches!(
            parse_record(b::PERF_RECORD_EXIT, 0, &body),
            Some(Record::Exit { tid: 9, .. })
        ));
        assert_eq!(parse_record(b::PERF_RECORD_SAMPLE, 0, &body[..8]), None);
    }

    #[test]
    fn comm_is_an_exec_with_the_exec_flag_else_a_rename() {
        // pid/tid, the name, then the trailer: pid/tid, time, cpu, id.
        let body = bytes(&[
            (5u64 << 32) | 5,
            u64::from_ne_bytes(*b"sh\0\0\0\0\0\0"),
            (5u64 << 32) | 5,
            4_242,
            1,
            77,
        ]);
        let exec = b::PERF_RECORD_MISC_COMM_EXEC as u16;
        assert_eq!(
            parse_record(b::PERF_RECORD_COMM, exec, &body),
            Some(Record::Exec {
                pid: 5,
                tid: 5,
                time: 4_242,
                name: "sh".into()
            })
        );
        assert_eq!(
            parse_record(b::PERF_RECORD_COMM, 0, &body),
            Some(Record::Comm {
                pid: 5,
                tid: 5,
                name: "sh".into()
            })
        );
    }
}
