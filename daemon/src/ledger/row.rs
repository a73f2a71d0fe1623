//! One thread's row of the ledger: its slot bitmaps, who holds each slot,
//! its lineage (birth time and inheritance windows, out of line), and the
//! one classification of a slot ([`SlotState`]).

use crate::arch::current::SLOTS;
use crate::error::Holder;
use crate::model::{Pid, SlotKey, Tid, WatchId};

/// One thread's slots: 56 bytes, so that with its tid key a row is one
/// 64-byte cache line and the rows of 10,000 threads fit in a core's L2
/// cache. In declaration order (`repr(C)`), the fields every reserve,
/// commit and release reads come first (48 bytes); what only perf's thread
/// creation records set (birth time, inheritance windows) lives out of line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C)]
pub struct ThreadSlots {
    /// Process the thread belongs to.
    pub pid: Pid,
    /// Slots holding one of our committed watchpoints.
    pub ours: u8,
    /// Slots reserved by a request whose syscall is in flight.
    pub pending: u8,
    /// Slots the kernel refused us: someone else holds them.
    pub foreign: u8,
    /// Slots whose watchpoint the kernel copies into threads this one creates.
    pub inheritable: u8,
    /// Slots whose inheritance into this thread is not known yet.
    pub uncertain: u8,
    /// Slots freed by us that the kernel still reserves until exec or exit
    /// (a ptrace-created breakpoint, kernel-facts §2): reusable by ptrace,
    /// unavailable to perf.
    pub retained: u8,
    /// Thread that created it while we watched (0: found by scanning).
    pub parent: Tid,
    /// Watchpoint piece in each slot, a packed [`SlotKey`] (meaningful
    /// where `ours | pending | uncertain` is set).
    pub holder: [u64; SLOTS],
    /// Birth time and inheritance windows; `None` while all are zero.
    pub(super) lineage: Option<Box<Lineage>>,
}

const _: () = assert!(std::mem::size_of::<ThreadSlots>() == 56);
const _: () = assert!(std::mem::size_of::<(Tid, ThreadSlots)>() == 64);

/// The part of a row only perf's thread-creation records set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Lineage {
    /// CLOCK_MONOTONIC ns of the FORK record that announced the thread.
    born: u64,
    /// Per slot, when threads this one creates inherit its breakpoint
    /// (see [`InheritWindow`]).
    windows: [InheritWindow; SLOTS],
}

/// When a slot's inheritable breakpoint reaches the threads its holder
/// creates (CLOCK_MONOTONIC ns; see `Ledger::on_fork` and [`classify`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InheritWindow {
    /// A thread born before this certainly did not inherit it.
    pub absent_before: u64,
    /// A thread born from this on certainly inherited it.
    pub certain_from: u64,
}

impl ThreadSlots {
    /// Slot `s`'s inheritance window (zero if never set).
    pub fn window(&self, s: usize) -> InheritWindow {
        self.lineage
            .as_ref()
            .map(|l| l.windows[s])
            .unwrap_or_default()
    }

    pub(super) fn set_window(&mut self, s: usize, w: InheritWindow) {
        self.lineage.get_or_insert_with(Default::default).windows[s] = w;
    }

    /// CLOCK_MONOTONIC ns of the FORK record that announced the thread (0:
    /// found by scanning, or created under ptrace).
    pub fn born(&self) -> u64 {
        self.lineage.as_ref().map_or(0, |l| l.born)
    }

    pub(super) fn set_born(&mut self, t: u64) {
        if t != 0 || self.lineage.is_some() {
            self.lineage.get_or_insert_with(Default::default).born = t;
        }
    }

    pub(super) fn new(pid: Pid, parent: Tid) -> Self {
        ThreadSlots {
            pid,
            parent,
            ours: 0,
            pending: 0,
            foreign: 0,
            inheritable: 0,
            holder: [0; SLOTS],
            lineage: None,
            uncertain: 0,
            retained: 0,
        }
    }

    /// The slot holding `key` (a watchpoint's piece; a [`WatchId`] means
    /// its piece 0), committed, pending or uncertain.
    pub fn slot_of(&self, key: impl Into<SlotKey>) -> Option<usize> {
        let k = key.into().pack();
        (0..SLOTS).find(|&s| {
            (self.ours | self.pending | self.uncertain) & (1 << s) != 0 && self.holder[s] == k
        })
    }

    /// The slots holding any piece of `id`, committed, pending or uncertain.
    pub fn mask_of(&self, id: WatchId) -> u8 {
        let used = self.ours | self.pending | self.uncertain;
        (0..SLOTS)
            .filter(|&s| used & (1 << s) != 0 && SlotKey::unpack(self.holder[s]).id == id)
            .fold(0, |m, s| m | (1 << s))
    }

    /// The key in slot `s` (meaningful where the slot is used).
    pub fn key(&self, s: usize) -> SlotKey {
        SlotKey::unpack(self.holder[s])
    }

    /// Who holds slot `s`: the one classification of a slot, used by
    /// listings and refusals alike. Ours first, then a request in flight (or
    /// an inheritance not known yet), then someone else, then a slot the
    /// kernel keeps for us.
    pub fn slot_state(&self, s: usize) -> SlotState {
        let bit = 1 << s;
        if self.ours & bit != 0 {
            SlotState::Ours(self.key(s))
        } else if (self.pending | self.uncertain) & bit != 0 {
            SlotState::Pending(self.key(s))
        } else if self.foreign & bit != 0 {
            SlotState::Foreign
        } else if self.retained & bit != 0 {
            SlotState::Retained
        } else {
            SlotState::Free
        }
    }

    /// Who holds each slot that is not free.
    pub fn holders(&self) -> Vec<Holder> {
        (0..SLOTS)
            .filter_map(|s| match self.slot_state(s) {
                SlotState::Free => None,
                SlotState::Ours(k) => Some(Holder::Ours(k.id)),
                SlotState::Pending(k) => Some(Holder::Pending(k.id)),
                SlotState::Foreign => Some(Holder::Foreign),
                SlotState::Retained => Some(Holder::Retained),
            })
            .collect()
    }
}

/// Who holds one slot of one thread ([`ThreadSlots::slot_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Nobody, as far as the daemon knows.
    Free,
    /// A piece of one of our watchpoints.
    Ours(SlotKey),
    /// Being armed, or its inheritance not known yet.
    Pending(SlotKey),
    /// Someone else: the kernel refused it to us.
    Foreign,
    /// Freed by us, still reserved by the kernel (a ptrace breakpoint's).
    Retained,
}

/// What the slot policy does with slots the kernel keeps for us after one
/// of our watchpoints left them (set by the backend: [`crate::backend::Backend::retained`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retained {
    /// Reuse them first (they are ours to the kernel: ptrace breakpoints).
    Reuse,
    /// Never hand them out (the kernel refuses them to this backend).
    Avoid,
}

/// A reservation: slot `slot` of `tid` for one piece of a watchpoint,
/// pending until commit or rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Thread.
    pub tid: Tid,
    /// Slot index.
    pub slot: u8,
    /// The watchpoint's piece it is for (a stale reservation of another key
    /// is ignored).
    pub key: SlotKey,
}

impl Reservation {
    pub(super) fn holds(&self, row: &ThreadSlots) -> bool {
        row.pending & (1 << self.slot) != 0 && row.holder[self.slot as usize] == self.key.pack()
    }
}
