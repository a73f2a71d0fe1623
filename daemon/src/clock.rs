//! The daemon's clocks: CLOCK_MONOTONIC (what perf records carry, with
//! `use_clockid`) and CLOCK_REALTIME (what events and the API report).

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME now, in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn clocks_move_forward() {
        let (m0, r0) = (super::monotonic_ns(), super::realtime_ns());
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(super::monotonic_ns() >= m0 + 2_000_000);
        assert!(super::realtime_ns() > r0);
        assert!(r0 > 1_600_000_000_000_000_000, "realtime is Unix time");
    }
}
