//! The order a process's dynamic linker loaded its modules in: its list of
//! loaded objects (`_r_debug.r_map`, a chain of `struct link_map`), the
//! executable first, then the libraries it needs, then each dlopen's
//! library followed by those it needs. The order of the modules' addresses
//! is not that order: mmap places a later mapping below an earlier one as
//! a rule, and in any gap that fits, so a library loaded by a dlopen
//! usually lies below the library that needed it.

use super::files::FileKey;
use super::maps::MappedFile;

/// `AT_BASE` in the auxiliary vector: where the dynamic linker is loaded
/// (0 without one).
const AT_BASE: u64 = 7;

/// `r_map`'s offset in `struct r_debug` (after `int r_version`, padded).
const R_MAP: u64 = 8;

/// `l_ld`'s and `l_next`'s offsets in `struct link_map` (after `l_addr`
/// and `l_name`), and the bytes read of each object (up to `l_next`'s end).
const L_LD: usize = 16;
const L_NEXT: usize = 24;
const HEAD: usize = 32;

/// Objects followed at most: a list changing while it is read, or looping,
/// ends there.
const MAX_OBJECTS: usize = 1 << 16;

/// The symbol of the dynamic linker's `struct r_debug`.
pub const R_DEBUG: &str = "_r_debug";

/// `AT_BASE` of an auxiliary vector (`/proc/PID/auxv`: pairs of native
/// words, ending at `AT_NULL`), unless 0 or absent.
pub fn at_base(auxv: &[u8]) -> Option<u64> {
    auxv.chunks_exact(16)
        .map(|p| (word(p, 0), word(p, 8)))
        .take_while(|&(tag, _)| tag != 0)
        .find(|&(tag, _)| tag == AT_BASE)
        .map(|(_, v)| v)
        .filter(|&v| v != 0)
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The `l_ld` (the runtime address of the object's dynamic section) of
/// each object in the list of the `struct r_debug` at `r_debug`, in the
/// list's order; `read(addr, len)` reads the process (`None`: unreadable,
/// and the list ends there).
pub fn dynamic_addrs(
    r_debug: u64,
    mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>,
) -> Vec<u64> {
    let mut out = Vec::new();
    let Some(head) = read(r_debug + R_MAP, 8).filter(|b| b.len() == 8) else {
        return out;
    };
    let mut at = word(&head, 0);
    let mut seen = std::collections::HashSet::new();
    while at != 0 && out.len() < MAX_OBJECTS && seen.insert(at) {
        let Some(lm) = read(at, HEAD).filter(|b| b.len() == HEAD) else {
            break;
        };
        out.push(word(&lm, L_LD));
        at = word(&lm, L_NEXT);
    }
    out
}

/// `files` (in address order) in load order: the executable (`exe`)
/// first, then the files holding the objects' dynamic sections (`lds`,
/// in the list's order), then any the list does not name, in the order
/// given.
pub fn load_order<'f>(
    mut files: Vec<&'f MappedFile>,
    exe: Option<&FileKey>,
    lds: &[u64],
) -> Vec<&'f MappedFile> {
    files.sort_by_key(|f| {
        let is_exe = exe.is_some_and(|k| k.dev == f.dev && k.inode == f.inode);
        let listed = lds
            .iter()
            .position(|&ld| f.contains(ld))
            .unwrap_or(usize::MAX);
        (!is_exe, listed)
    });
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::maps::parse;

    #[test]
    fn at_base_is_read_up_to_at_null() {
        let v = |pairs: &[(u64, u64)]| -> Vec<u8> {
            pairs
                .iter()
                .flat_map(|&(t, v)| [t.to_ne_bytes(), v.to_ne_bytes()])
                .flatten()
                .collect()
        };
        assert_eq!(at_base(&v(&[(6, 4096), (7, 0x7f00), (0, 0)])), Some(0x7f00));
        assert_eq!(at_base(&v(&[(6, 4096), (7, 0), (0, 0)])), None, "no loader");
        assert_eq!(at_base(&v(&[(6, 4096), (0, 0), (7, 0x7f00)])), None);
        assert_eq!(at_base(&[]), None);
    }

    /// A process's memory: `struct link_map`s at the given addresses.
    fn memory(
        r_debug: u64,
        objects: &[(u64, u64, u64)],
    ) -> std::collections::HashMap<u64, Vec<u8>> {
        let mut m = std::collections::HashMap::new();
        let first = objects.first().map_or(0, |o| o.0);
        m.insert(r_debug + R_MAP, first.to_ne_bytes().to_vec());
        for &(at, ld, next) in objects {
            let mut b = vec![0u8; HEAD];
            b[L_LD..L_LD + 8].copy_from_slice(&ld.to_ne_bytes());
            b[L_NEXT..L_NEXT + 8].copy_from_slice(&next.to_ne_bytes());
            m.insert(at, b);
        }
        m
    }

    #[test]
    fn the_list_is_followed_in_order_and_ends_at_a_loop_or_an_unreadable_object() {
        let m = memory(
            0x100,
            &[
                (0x1000, 0xa, 0x3000),
                (0x3000, 0xb, 0x2000),
                (0x2000, 0xc, 0),
            ],
        );
        let read = |at: u64, n: usize| m.get(&at).map(|b| b[..n].to_vec());
        assert_eq!(dynamic_addrs(0x100, read), [0xa, 0xb, 0xc]);
        let m = memory(0x100, &[(0x1000, 0xa, 0x2000), (0x2000, 0xb, 0x1000)]);
        let read = |at: u64, n: usize| m.get(&at).map(|b| b[..n].to_vec());
        assert_eq!(dynamic_addrs(0x100, read), [0xa, 0xb], "a loop ends it");
        let m = memory(0x100, &[(0x1000, 0xa, 0x9000)]);
        let read = |at: u64, n: usize| m.get(&at).map(|b| b[..n].to_vec());
        assert_eq!(
            dynamic_addrs(0x100, read),
            [0xa],
            "an unreadable object ends it"
        );
        assert!(dynamic_addrs(0x100, |_, _| None).is_empty());
    }

    /// One dlopen of `libroot.so`, which needs `libdep.so`: the loader maps
    /// the root, then the library it needs, below it. Address order puts
    /// the library needed first; load order the root.
    #[test]
    fn load_order_is_the_lists_not_the_addresses() {
        let files = parse(
            "\
55d0c09ef000-55d0c09f0000 r-xp 00001000 fd:01 1 /opt/app
55d0c09f0000-55d0c09f1000 r--p 00002000 fd:01 1 /opt/app
7f0000000000-7f0000001000 r-xp 00001000 fd:01 30 /opt/libother.so
7f1000000000-7f1000001000 r-xp 00001000 fd:01 20 /opt/libdep.so
7f1000001000-7f1000002000 r--p 00002000 fd:01 20 /opt/libdep.so
7f2000000000-7f2000001000 r-xp 00001000 fd:01 10 /opt/libroot.so
7f2000001000-7f2000002000 r--p 00002000 fd:01 10 /opt/libroot.so
7f3000000000-7f3000001000 r-xp 00001000 fd:01 40 /lib/ld.so
7f3000001000-7f3000002000 r--p 00002000 fd:01 40 /lib/ld.so
",
        );
        let names = |v: Vec<&MappedFile>| -> Vec<String> {
            v.iter().map(|f| f.name().to_string()).collect()
        };
        let all: Vec<&MappedFile> = files.iter().collect();
        assert_eq!(
            names(all.clone()),
            ["app", "libother.so", "libdep.so", "libroot.so", "ld.so"]
        );
        let exe = FileKey {
            dev: "fd:01".into(),
            inode: 1,
        };
        // The list: the executable, the loader, then the dlopen's root and
        // the library it needs; libother.so is in no list (another
        // namespace): last.
        let lds = [
            0x55d0c09f0800,
            0x7f3000001800,
            0x7f2000001800,
            0x7f1000001800,
        ];
        assert_eq!(
            names(load_order(all.clone(), Some(&exe), &lds)),
            ["app", "ld.so", "libroot.so", "libdep.so", "libother.so"]
        );
        // The executable first even if the list names it later, or not.
        let late = [0x7f2000001800, 0x55d0c09f0800];
        assert_eq!(
            names(load_order(all.clone(), Some(&exe), &late)),
            ["app", "libroot.so", "libother.so", "libdep.so", "ld.so"]
        );
        // No list read: address order, the executable first.
        assert_eq!(
            names(load_order(all, Some(&exe), &[])),
            ["app", "libother.so", "libdep.so", "libroot.so", "ld.so"]
        );
    }
}
