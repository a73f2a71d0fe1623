//! `libwpd_feedback.so`: loaded into a fuzzed program (`AFL_PRELOAD`, which
//! afl-fuzz turns into the target's `LD_PRELOAD`), it gives a watched
//! variable's values to AFL++ as coverage (kernel-facts §24):
//!
//! - **Room in the map.** AFL++ reads, after each run, only as many bytes
//!   of its map as the target reports at the fork server's handshake
//!   (`__afl_map_size`, its edge count). The runtime sets that size, then
//!   attaches the fuzzer's segment with `shmat`, then shakes hands: this
//!   library's `shmat` raises `__afl_map_size` by [`ROOM`] bytes in
//!   between, so afl-fuzz reads them too, and feedback never lands on an
//!   edge's byte. `__afl_map_size` is not in the dynamic symbol table: it
//!   is found in the executable's own (`.symtab`); in a stripped program
//!   this library's `write` raises the size the fork server's handshake
//!   sends instead.
//! - **Counting.** wpd's feedback breakpoints are opened with `sigtrap`:
//!   each store sends the storing thread a `SIGTRAP` (`si_code`
//!   `TRAP_PERF`, `si_addr` the watched address, the breakpoint's
//!   `sig_data` in `si_perf_data`) before its next instruction. The handler
//!   reads the value (and another variable's, if the watch names one),
//!   and increments the map bytes `wpd_feedback_key::Trap::bytes` names
//!   (the value's own; with `--feedback max`, its bucket's and every lower
//!   one's), in the room: the run that made the store gets the credit. Other
//!   `SIGTRAP`s go to the handler the program had.
//!
//! - **libFuzzer** (`-fsanitize=fuzzer`) reads the 8-bit counters of every
//!   module that registered them, in the same process, after each input.
//!   Outside afl-fuzz, where the program exports libFuzzer's registration
//!   calls (`__sanitizer_cov_8bit_counters_init`, `__sanitizer_cov_pcs_init`:
//!   in its dynamic symbol table), the library registers a module of its
//!   own, [`ROOM`] counters ([`wpd_feedback_counters`]) with a table of as
//!   many made-up PCs (their own addresses), from its constructor, which
//!   runs before the program's: libFuzzer clears them before each input
//!   and counts them as features after it, like its edges
//!   (kernel-facts §24.11). That is the room.
//!
//! The daemon reads [`wpd_feedback_state`] to know the library is there
//! and the room made before it opens a breakpoint that signals.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use wpd_feedback_key::Trap;

/// Bytes of the map kept for feedback, after the edges.
pub const ROOM: u32 = 512;

/// `si_code` of a perf event's `SIGTRAP`.
const TRAP_PERF: c_int = 6;
/// Offset of `si_perf_data` in `siginfo_t` (x86-64: after `si_addr`).
const SI_PERF_DATA: usize = 24;

/// What the library found, read by the daemon from the process
/// (`libwpd_feedback.so:wpd_feedback_state`): `magic`, then the map's
/// address (AFL++'s segment, or [`wpd_feedback_counters`] for libFuzzer),
/// the room's first byte in it (AFL++: the edge count; libFuzzer: 0) and
/// size (0: no room made), and how many feedback traps were counted.
#[repr(C)]
pub struct State {
    magic: u64,
    map: AtomicU64,
    base: AtomicU32,
    room: AtomicU32,
    traps: AtomicU64,
}

/// `b"wpdfeed1"`, little-endian: the layout above, version 1.
pub const MAGIC: u64 = u64::from_le_bytes(*b"wpdfeed1");

/// The library's state (see [`State`]).
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
#[used]
pub static wpd_feedback_state: State = State {
    magic: MAGIC,
    map: AtomicU64::new(0),
    base: AtomicU32::new(0),
    room: AtomicU32::new(0),
    traps: AtomicU64::new(0),
};

/// libFuzzer's room: counters of the library's own module, registered
/// with libFuzzer ([`register_with_libfuzzer`]), and their PC table.
#[repr(C, align(64))]
pub struct Counters<T>(UnsafeCell<T>);

// SAFETY: the counters are bytes that the handler increments and libFuzzer
// clears and reads on the thread running inputs, as it does its edges'; the
// PC table is written once, by the constructor, before anyone reads it.
unsafe impl<T> Sync for Counters<T> {}

/// The counters of libFuzzer's room (the daemon checks the state's `map`
/// against this symbol's address).
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
#[used]
pub static wpd_feedback_counters: Counters<[u8; ROOM as usize]> =
    Counters(UnsafeCell::new([0; ROOM as usize]));

/// (PC, flags) per counter: libFuzzer wants a table as long as the
/// counters; each "PC" is its counter's address, no flags.
static PCS: Counters<[usize; 2 * ROOM as usize]> =
    Counters(UnsafeCell::new([0; 2 * ROOM as usize]));

/// The program's `SIGTRAP` action before this library's.
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    // SAFETY: a zeroed sigaction is valid; the handler has the
    // SA_SIGINFO signature; the previous action is leaked on purpose (it
    // lives as long as the process).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_trap as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        let old = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
        if libc::sigaction(libc::SIGTRAP, &sa, old) == 0 {
            PREVIOUS.store(old, Ordering::Release);
        }
    }
    // Under afl-fuzz the room is made at the runtime's shmat; a libFuzzer
    // target run by afl-fuzz (a driver of AFL++'s) is AFL++'s.
    if std::env::var_os("__AFL_SHM_ID").is_none() {
        register_with_libfuzzer();
    }
}

type CountersInit = unsafe extern "C" fn(*mut u8, *mut u8);
type PcsInit = unsafe extern "C" fn(*const usize, *const usize);

/// In a libFuzzer target, registers [`wpd_feedback_counters`] as a module
/// of libFuzzer's and records it as the room.
fn register_with_libfuzzer() {
    // SAFETY: symbol lookups by constant names.
    let (ci, pi) = unsafe {
        (
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"__sanitizer_cov_8bit_counters_init".as_ptr(),
            ),
            libc::dlsym(libc::RTLD_DEFAULT, c"__sanitizer_cov_pcs_init".as_ptr()),
        )
    };
    if ci.is_null() || pi.is_null() {
        return;
    }
    let counters = wpd_feedback_counters.0.get().cast::<u8>();
    let pcs = PCS.0.get().cast::<usize>();
    let n = ROOM as usize;
    // SAFETY: the constructor runs once, before any thread of the program;
    // the table has 2 * ROOM words; libFuzzer's calls take these bounds
    // (one past the end) and keep them for the process's life, which the
    // statics outlive.
    unsafe {
        for i in 0..n {
            pcs.add(2 * i).write(counters.add(i) as usize);
            pcs.add(2 * i + 1).write(0);
        }
        std::mem::transmute::<*mut c_void, CountersInit>(ci)(counters, counters.add(n));
        std::mem::transmute::<*mut c_void, PcsInit>(pi)(pcs, pcs.add(2 * n));
    }
    let s = &wpd_feedback_state;
    s.base.store(0, Ordering::Relaxed);
    s.room.store(ROOM, Ordering::Relaxed);
    s.map.store(counters as u64, Ordering::Release);
}

extern "C" fn on_trap(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo; `si_perf_data` is at its
    // x86-64 offset for TRAP_PERF; the watched address was just stored to
    // by this thread, so it is mapped, and the other variable is the
    // program's (read as the program would).
    unsafe {
        if (*info).si_code == TRAP_PERF {
            let data = info
                .cast::<u8>()
                .add(SI_PERF_DATA)
                .cast::<u64>()
                .read_unaligned();
            if let Some(t) = Trap::decode(data) {
                count(&t, (*info).si_addr() as u64);
                return;
            }
        }
        forward(sig, info, ctx);
    }
}

/// Counts one trap's value in the room.
///
/// # Safety
/// `addr` and the trap's other variable must be readable.
unsafe fn count(t: &Trap, addr: u64) {
    let s = &wpd_feedback_state;
    let room = s.room.load(Ordering::Relaxed);
    let map = s.map.load(Ordering::Relaxed);
    if room == 0 || map == 0 {
        return;
    }
    // SAFETY: the caller's promise.
    let (v, w) = unsafe {
        (
            wpd_feedback_key::read_value(addr, t.len),
            t.with
                .map_or(0, |(a, l)| wpd_feedback_key::read_value(a, l)),
        )
    };
    let base = map + u64::from(s.base.load(Ordering::Relaxed));
    for b in t.bytes(v, w, room) {
        bump(base + u64::from(b));
    }
    s.traps.fetch_add(1, Ordering::Relaxed);
}

/// Counts `v` (with `w`) in the room as a feedback trap of `mode` (0
/// values, 1 max) and `tag` would: the same bytes, from the program's own
/// source (IJON's way), without a breakpoint. What a benchmark compares
/// wpd's traps with.
#[unsafe(no_mangle)]
pub extern "C" fn wpd_feedback_count(v: u64, w: u64, mode: u32, tag: u32) {
    let s = &wpd_feedback_state;
    let (room, map) = (
        s.room.load(Ordering::Relaxed),
        s.map.load(Ordering::Relaxed),
    );
    if room == 0 || map == 0 {
        return;
    }
    let t = Trap {
        mode: if mode == 1 {
            wpd_feedback_key::Mode::Max
        } else {
            wpd_feedback_key::Mode::Values
        },
        len: 8,
        with: None,
        tag: tag as u16,
    };
    let base = map + u64::from(s.base.load(Ordering::Relaxed));
    for b in t.bytes(v, w, room) {
        bump(base + u64::from(b));
    }
}

/// Increments the map byte at `at`.
fn bump(at: u64) {
    let b = at as *mut u8;
    // SAFETY: callers pass a byte of the room: within AFL++'s segment (the
    // room was made only where base + room fits in it: `make_room`), or
    // one of the library's own counters.
    unsafe {
        let n = b.read_volatile().wrapping_add(1);
        // 255 + 1 is 1, as AFL++'s counters: a byte once hit never reads 0.
        b.write_volatile(if n == 0 { 1 } else { n });
    }
}

/// Hands a `SIGTRAP` that is not a feedback trap to the program's own
/// action; with none (the default), the default action is restored and
/// the trap returns to the instruction, which traps again and ends the
/// program as it would have without this library.
///
/// # Safety
/// The arguments are the handler's.
unsafe fn forward(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let old = PREVIOUS.load(Ordering::Acquire);
    if old.is_null() {
        return;
    }
    // SAFETY: `old` was filled by sigaction and is never freed.
    let old = unsafe { &*old };
    match old.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: restoring the program's own action.
            unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
            if unsafe { (*info).si_code } > 0 && unsafe { (*info).si_code } != TRAP_PERF {
                // A trap of an instruction (int3, a single step): it
                // does not repeat by itself; raise it again under the
                // default action.
                unsafe { libc::raise(sig) };
            }
        }
        f if old.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this handler with this
            // signature.
            let h: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(f) };
            h(sig, info, ctx);
        }
        f => {
            // SAFETY: as above, the one-argument form.
            let h: extern "C" fn(c_int) = unsafe { std::mem::transmute(f) };
            h(sig);
        }
    }
}

type ShmatFn = unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void;

/// The C library's `shmat`, this library's in front of it.
///
/// # Safety
/// As `shmat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut real = REAL.load(Ordering::Acquire);
    if real.is_null() {
        // SAFETY: a symbol lookup by a constant name.
        real = unsafe { libc::dlsym(libc::RTLD_NEXT, c"shmat".as_ptr()) };
        if real.is_null() {
            return usize::MAX as *mut c_void;
        }
        REAL.store(real, Ordering::Release);
    }
    // SAFETY: `real` is the C library's shmat.
    let p = unsafe { std::mem::transmute::<*mut c_void, ShmatFn>(real)(id, addr, flags) };
    let afl = std::env::var("__AFL_SHM_ID")
        .ok()
        .and_then(|s| s.parse::<c_int>().ok());
    if p as usize != usize::MAX
        && afl == Some(id)
        && wpd_feedback_state.map.load(Ordering::Relaxed) == 0
    {
        make_room(id, p as u64);
    }
    p
}

/// AFL++'s map attached at `map` (segment `id`): raises `__afl_map_size`
/// by [`ROOM`] if the segment has the bytes, and records where the room
/// is. Without the symbol (a stripped program), the segment is kept for
/// the fork server's handshake ([`write`]) to make the room instead.
fn make_room(id: c_int, map: u64) {
    // SAFETY: a zeroed shmid_ds is valid for IPC_STAT to fill.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    if unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) } != 0 {
        return;
    }
    let segment = ds.shm_segsz as u64;
    let Some(size_at) = exe_symbol("__afl_map_size") else {
        SEGMENT.store(segment, Ordering::Relaxed);
        SEGMENT_AT.store(map, Ordering::Release);
        return;
    };
    let size = size_at as *mut u32;
    // SAFETY: the runtime's own variable, a u32, written by it before
    // this shmat and read by it after.
    let edges = unsafe { size.read_volatile() };
    if edges == 0 || u64::from(edges) + u64::from(ROOM) > segment {
        return;
    }
    unsafe { size.write_volatile(edges + ROOM) };
    room_made(map, edges);
}

/// Records the room: [`ROOM`] bytes from `base` in the map at `map`.
fn room_made(map: u64, base: u32) {
    let s = &wpd_feedback_state;
    s.base.store(base, Ordering::Relaxed);
    s.room.store(ROOM, Ordering::Relaxed);
    s.map.store(map, Ordering::Release);
}

/// afl-fuzz's segment, attached where `__afl_map_size` was not found: its
/// address (0: none) and size.
static SEGMENT_AT: AtomicU64 = AtomicU64::new(0);
static SEGMENT: AtomicU64 = AtomicU64::new(0);

/// The fork server's status pipe (AFL++'s `FORKSRV_FD + 1`).
const FORKSRV_STATUS: c_int = 199;
/// The handshake's options (AFL++ 4.0x, `include/types.h`): the fork
/// server speaks options, one of which is the map's size, sent as
/// `(size - 1) << 1` in the bits of `MAPSIZE_BITS`, for sizes up to 2^23.
const FS_OPT_ENABLED: u32 = 0x8000_0001;
const FS_OPT_MAPSIZE: u32 = 0x4000_0000;
const MAPSIZE_BITS: u32 = 0x00ff_fffe;
const FS_OPT_MAX_MAPSIZE: u32 = (MAPSIZE_BITS >> 1) + 1;

/// The handshake `status` with its map size raised by [`ROOM`], and the
/// size it said (the room's first byte), if it says one and `segment`
/// bytes hold the larger map.
fn grown_handshake(status: u32, segment: u64) -> Option<(u32, u32)> {
    if status & FS_OPT_ENABLED != FS_OPT_ENABLED || status & FS_OPT_MAPSIZE == 0 {
        return None;
    }
    let edges = ((status & MAPSIZE_BITS) >> 1) + 1;
    let grown = edges.checked_add(ROOM)?;
    if edges <= 1 || grown > FS_OPT_MAX_MAPSIZE || u64::from(grown) > segment {
        return None;
    }
    Some(((status & !MAPSIZE_BITS) | ((grown - 1) << 1), edges))
}

type WriteFn = unsafe extern "C" fn(c_int, *const c_void, libc::size_t) -> libc::ssize_t;

/// The C library's `write`, this library's in front of it: in a program
/// whose `__afl_map_size` is not in its symbol table (stripped), the fork
/// server's handshake is sent with the map's size raised by [`ROOM`]
/// (kernel-facts §24.9), so afl-fuzz reads the room too; the runtime, which
/// only writes the edges' bytes, goes on with its own size.
///
/// # Safety
/// As `write(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: libc::size_t) -> libc::ssize_t {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut real = REAL.load(Ordering::Acquire);
    if real.is_null() {
        // SAFETY: a symbol lookup by a constant name.
        real = unsafe { libc::dlsym(libc::RTLD_NEXT, c"write".as_ptr()) };
        if real.is_null() {
            // SAFETY: setting errno, as a failed write would.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            return -1;
        }
        REAL.store(real, Ordering::Release);
    }
    // SAFETY: `real` is the C library's write.
    let real = unsafe { std::mem::transmute::<*mut c_void, WriteFn>(real) };
    // Only the first write to the status pipe is the handshake; the ones
    // after it are children's pids and statuses.
    let map = if fd == FORKSRV_STATUS && n == 4 && !buf.is_null() {
        SEGMENT_AT.swap(0, Ordering::AcqRel)
    } else {
        0
    };
    if map != 0 {
        // SAFETY: the caller's 4 bytes.
        let status = unsafe { buf.cast::<u32>().read_unaligned() };
        if let Some((grown, edges)) = grown_handshake(status, SEGMENT.load(Ordering::Relaxed)) {
            // SAFETY: 4 bytes of ours.
            let sent = unsafe { real(fd, (&grown as *const u32).cast(), 4) };
            if sent == 4 {
                room_made(map, edges);
            }
            return sent;
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real(fd, buf, n) }
}

/// The run-time address of `name` in the executable's symbol table.
fn exe_symbol(name: &str) -> Option<u64> {
    use object::{Object, ObjectSymbol};
    let bytes = std::fs::read("/proc/self/exe").ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let sym = file.symbols().find(|s| s.name() == Ok(name))?;
    let bias = if file.kind() == object::ObjectKind::Executable {
        0
    } else {
        main_bias()?
    };
    Some(sym.address() + bias)
}

/// The executable's load bias: the first object `dl_iterate_phdr` lists.
fn main_bias() -> Option<u64> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid entry; `out` is the u64 below.
        unsafe { *out.cast::<u64>() = (*info).dlpi_addr };
        1
    }
    let mut bias = u64::MAX;
    // SAFETY: the callback writes one u64 through its argument.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut bias as *mut u64).cast()) };
    (bias != u64::MAX).then_some(bias)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AFL++ 4.04c's handshake for a map of `size` bytes.
    fn handshake(size: u32) -> u32 {
        FS_OPT_ENABLED | FS_OPT_MAPSIZE | ((size - 1) << 1)
    }

    #[test]
    fn the_handshake_says_the_room_too() {
        let (grown, edges) = grown_handshake(handshake(11), 1 << 16).unwrap();
        assert_eq!(edges, 11);
        assert_eq!(grown, handshake(11 + ROOM));
        // Other options kept (AFL++'s shared-memory input, 0x01000000).
        let (grown, _) = grown_handshake(handshake(11) | 0x0100_0000, 1 << 16).unwrap();
        assert_eq!(grown, handshake(11 + ROOM) | 0x0100_0000);
    }

    #[test]
    fn no_room_where_the_handshake_says_no_size_or_the_segment_is_full() {
        assert_eq!(grown_handshake(FS_OPT_ENABLED, 1 << 16), None);
        assert_eq!(
            grown_handshake(0x1234_5678 & !FS_OPT_ENABLED, 1 << 16),
            None
        );
        assert_eq!(grown_handshake(handshake(65_536), 65_536), None);
        assert_eq!(
            grown_handshake(handshake(FS_OPT_MAX_MAPSIZE), u64::MAX),
            None
        );
    }
}
