//! Where hits come from: instruction pointers symbolized by `blazesym` on a
//! thread of its own (its symbolizer is `!Send`), never on the hit path.
//!
//! One such thread per owner (real uid) of the processes symbolized
//! (`wpd-sym-UID`): the files a process maps and the debug files they name
//! are its owner's choice, and a file that is slow to read (on a FUSE or NFS
//! server that stalls) delays only its owner's events. `blazesym` is given
//! only files the loader (`files.rs`) opened and checked, as
//! `/proc/self/fd/N`, and never a file naming other files (which it would
//! open by path itself): their symbol tables only. A module whose file has
//! not loaded within [`EVENT_WAIT`](super::files::EVENT_WAIT) of its load's
//! start gives its hits a place naming the module only, not kept: later
//! hits get the places once it is loaded.
//!
//! A hit carries its process's [`Image`] (one per exec): the image reads
//! `/proc/PID/maps` once, and again only for an address no mapping of the
//! last read holds (a library loaded since); it caches every frame it has
//! given out by address, so a process with 1,000 hitting instruction
//! pointers costs 1,000 symbolizations, not one per hit. Below the images,
//! the symbolizer thread caches module-relative frames by (file, address),
//! shared by every process mapping the file (a fork server's children).
//!
//! What is symbolized: a data breakpoint traps *after* the instruction that
//! made the access, so the reported instruction pointer is the next
//! instruction's. The byte before it belongs to the accessing instruction
//! whenever that instruction did not jump (every load and store but a
//! `call`'s push, a `ret`'s pop, or a string instruction in mid-repeat), so
//! `ip - 1` is looked up; callers' return addresses likewise (`ret - 1` is
//! in the `call`). The raw values are reported next to it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use dashmap::DashMap;

use super::files::{EVENT_WAIT, LoadError};
use super::maps::{self, MappedFile};
use super::{FileKey, Symbols};
use crate::model::Pid;

/// Source file, line and column.
type CodeAt = (String, u32, u32);

/// One symbolized address, module-relative (shared by every process that
/// maps the module).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Place {
    /// Function (demangled), if any symbol holds the address.
    pub function: Option<String>,
    /// Bytes from the function's start.
    pub function_offset: u64,
    /// Source file, when DWARF has line information.
    pub file: Option<String>,
    /// Line (0: unknown).
    pub line: u32,
    /// Column (0: unknown).
    pub column: u32,
    /// The functions the code at the address was inlined into, innermost
    /// first, each with the line of the inlined call: (function, file,
    /// line).
    pub inlined: Vec<(String, Option<String>, u32)>,
    /// The module's path in the process.
    pub module: Option<String>,
    /// The module's build id.
    pub build_id: Option<Arc<[u8]>>,
    /// The link-time address in the module.
    pub module_address: u64,
    /// The file offset of the address, when the file holds it.
    pub file_offset: Option<u64>,
    /// What the RPC layer sends of the place, encoded once by it on first
    /// use (opaque here).
    pub wire: Memo,
}

/// Bytes derived from a value once and kept with it, and a number given
/// to it on first asking; not part of what the value is (two values
/// compare equal whatever their memos hold).
#[derive(Debug, Clone, Default)]
pub struct Memo {
    bytes: OnceLock<Box<[u8]>>,
    number: OnceLock<u64>,
}

/// The last number [`Memo::number`] gave.
static NUMBERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Memo {
    /// The bytes, made by `make` the first time.
    pub fn get_or_init(&self, make: impl FnOnce() -> Vec<u8>) -> &[u8] {
        self.bytes.get_or_init(|| make().into_boxed_slice())
    }

    /// A number of its own, daemon-wide (never 0, never given to another
    /// memo), the same at every call.
    pub fn number(&self) -> u64 {
        *self
            .number
            .get_or_init(|| NUMBERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Memo) -> bool {
        true
    }
}

impl Eq for Memo {}

/// A frame of a hit: the raw address, the address looked up, and what is
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The instruction pointer (of the hit: after the access) or return
    /// address.
    pub ip: u64,
    /// The address symbolized (`ip - 1`, see the module doc; `ip` itself
    /// for the innermost frame of a thread stopped other than by its hit).
    pub lookup: u64,
    /// What is there.
    pub place: Arc<Place>,
}

/// One exec's worth of a process's address space, as far as symbolizing
/// it goes.
pub struct Image {
    /// Process.
    pub pid: Pid,
    files: Mutex<Option<Arc<Vec<MappedFile>>>>,
    /// Keyed by address with `foldhash` (addresses are not attacker-chosen
    /// in any way that matters here; SipHash was a visible share of a hit).
    frames: DashMap<u64, Arc<Place>, foldhash::fast::RandomState>,
    /// Superseded (the process called exec) or gone: never read its maps
    /// again.
    retired: AtomicBool,
    /// Some place is cached (set after the first insert): a hit of a
    /// process nobody asked to symbolize is not looked up (the journal
    /// encodes every hit and tries its location).
    any: AtomicBool,
    /// The process's owner (real uid), read at its first symbolization:
    /// which symbolizer thread it goes to.
    owner: OnceLock<u32>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("pid", &self.pid)
            .field("frames", &self.frames.len())
            .finish()
    }
}

impl Image {
    /// A fresh image of `pid` (at attach, and after each exec).
    pub fn new(pid: Pid) -> Arc<Image> {
        Arc::new(Image {
            pid,
            files: Mutex::new(None),
            frames: DashMap::default(),
            retired: AtomicBool::new(false),
            any: AtomicBool::new(false),
            owner: OnceLock::new(),
        })
    }

    /// The process's owner (real uid; `u32::MAX` when it is gone before
    /// its first symbolization).
    fn owner(&self) -> u32 {
        *self
            .owner
            .get_or_init(|| crate::procfs::creds(self.pid).map_or(u32::MAX, |(uids, _, _)| uids[0]))
    }

    /// The process called exec or is gone: what is cached stays, nothing
    /// more is read.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Caches `place` for `lookup`, as the symbolizer would.
    #[cfg(test)]
    pub fn insert_for_tests(&self, lookup: u64, place: Arc<Place>) {
        self.put(lookup, place);
    }

    /// Caches `place` for `lookup`.
    fn put(&self, lookup: u64, place: Arc<Place>) {
        self.frames.insert(lookup, place);
        self.any.store(true, Ordering::Release);
    }

    /// The frame cached for `lookup`.
    pub fn cached(&self, lookup: u64) -> Option<Arc<Place>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.frames.get(&lookup).map(|p| p.clone())
    }

    /// The mapped file holding `addr`: from the last read of the maps, or
    /// a new read when none holds it (a library loaded since) and the image
    /// is current.
    pub fn file_at(&self, addr: u64) -> Option<MappedFile> {
        let mut files = self.files.lock().unwrap();
        let find = |fs: &Arc<Vec<MappedFile>>| fs.iter().find(|f| f.contains(addr)).cloned();
        if let Some(fs) = files.as_ref()
            && let Some(f) = find(fs)
        {
            return Some(f);
        }
        if self.retired.load(Ordering::Acquire) && files.is_some() {
            return None;
        }
        let fresh = Arc::new(maps::read(self.pid).ok()?);
        let f = find(&fresh);
        *files = Some(fresh);
        f
    }
}

struct Job {
    image: Arc<Image>,
    lookups: Vec<u64>,
    /// Done; with the places given for now (not kept) to addresses whose
    /// module has not loaded yet.
    reply: tokio::sync::oneshot::Sender<Vec<(u64, Arc<Place>)>>,
}

/// What the symbolizer thread is asked.
enum Msg {
    /// Symbolize these addresses.
    Locate(Job),
    /// A process went away or called exec: let go of the modules no live
    /// image uses any more.
    Sweep,
}

/// The symbolizer: a thread per owner of the processes symbolized, each
/// owning a `blazesym::symbolize::Symbolizer`, fed through a channel.
pub struct Locator {
    /// The threads' channels, by owner (started on first use).
    tx: Mutex<HashMap<u32, mpsc::Sender<Msg>>>,
    places: AtomicU64,
    place_bytes: AtomicU64,
    /// Where the symbolizer looks for separate debug files.
    debug_dirs: Vec<PathBuf>,
}

impl Default for Locator {
    fn default() -> Self {
        Locator::with_debug_dirs(super::elf::default_debug_dirs())
    }
}

impl Locator {
    /// A locator whose symbolizer looks for debug files in `debug_dirs`.
    pub fn with_debug_dirs(debug_dirs: Vec<PathBuf>) -> Self {
        Locator {
            tx: Mutex::default(),
            places: AtomicU64::new(0),
            place_bytes: AtomicU64::new(0),
            debug_dirs,
        }
    }

    /// (places symbolized, bytes they hold).
    pub fn cached(&self) -> (u64, u64) {
        (
            self.places.load(Ordering::Relaxed),
            self.place_bytes.load(Ordering::Relaxed),
        )
    }
}

/// The frame of one instruction pointer, if cached.
pub fn cached_frame(image: &Image, ip: u64) -> Option<Frame> {
    let lookup = ip.saturating_sub(1);
    image
        .cached(lookup)
        .map(|place| Frame { ip, lookup, place })
}

/// The frames of `ips` in `image` if all are cached already (the common
/// case: no waiting, no thread hop).
pub fn cached_frames(image: &Image, ips: &[u64]) -> Option<Vec<Frame>> {
    ips.iter().map(|&ip| cached_frame(image, ip)).collect()
}

impl Symbols {
    /// Symbolizes `ips` of `image` (hit instruction pointers or return
    /// addresses), waiting for the symbolizer thread for those not cached.
    pub async fn frames(self: &Arc<Self>, image: &Arc<Image>, ips: &[u64]) -> Vec<Frame> {
        let at: Vec<(u64, u64)> = ips.iter().map(|&ip| (ip, ip.saturating_sub(1))).collect();
        self.frames_at(image, &at).await
    }

    /// Symbolizes `(ip, lookup)` pairs of `image`: each `lookup` is the
    /// address to symbolize for its `ip` (`ip - 1` after a trap or for a
    /// return address, `ip` itself where a stopped thread will resume).
    pub async fn frames_at(self: &Arc<Self>, image: &Arc<Image>, at: &[(u64, u64)]) -> Vec<Frame> {
        let cached: Option<Vec<Frame>> = at
            .iter()
            .map(|&(ip, lookup)| {
                image
                    .cached(lookup)
                    .map(|place| Frame { ip, lookup, place })
            })
            .collect();
        if let Some(f) = cached {
            return f;
        }
        let (reply, done) = tokio::sync::oneshot::channel();
        let job = Job {
            image: image.clone(),
            lookups: at.iter().map(|&(_, lookup)| lookup).collect(),
            reply,
        };
        let mut for_now = Vec::new();
        if self.send(image.owner(), Msg::Locate(job)) {
            for_now = done.await.unwrap_or_default();
        }
        at.iter()
            .map(|&(ip, lookup)| Frame {
                ip,
                lookup,
                place: image.cached(lookup).unwrap_or_else(|| {
                    for_now
                        .iter()
                        .find(|(a, _)| *a == lookup)
                        .map(|(_, p)| p.clone())
                        .unwrap_or_default()
                }),
            })
            .collect()
    }

    /// `pid` was let go of: the files loaded for it alone, and what the
    /// symbolizer holds for modules no current image maps, are dropped.
    pub fn forget(&self, pid: Pid) {
        self.files.forget(pid);
        self.sweep();
    }

    /// A process was let go of, or called exec (its old image retired):
    /// the symbolizer drops what it holds for modules that no current image
    /// maps, closing their files. Nothing to do before the first hit.
    pub fn sweep(&self) {
        for tx in self.locator.tx.lock().unwrap().values() {
            let _ = tx.send(Msg::Sweep);
        }
    }

    /// Sends `msg` to the symbolizer thread of `owner`'s processes,
    /// starting it on first use; false when it cannot be.
    fn send(self: &Arc<Self>, owner: u32, msg: Msg) -> bool {
        let mut txs = self.locator.tx.lock().unwrap();
        if let Some(tx) = txs.get(&owner) {
            return tx.send(msg).is_ok();
        }
        let (tx, rx) = mpsc::channel::<Msg>();
        let me = Arc::downgrade(self);
        let dirs = self.locator.debug_dirs.clone();
        let name = if owner == u32::MAX {
            "wpd-sym-gone".to_string()
        } else {
            format!("wpd-sym-{owner}")
        };
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || worker(me, rx, dirs))
        {
            Ok(_) => {
                let sent = tx.send(msg).is_ok();
                txs.insert(owner, tx);
                sent
            }
            Err(e) => {
                tracing::error!(owner, error = %e, "cannot start a symbolizer thread");
                false
            }
        }
    }

    /// The symbolizer threads running (one per owner of the processes
    /// symbolized).
    pub fn symbolizer_threads(&self) -> usize {
        self.locator.tx.lock().unwrap().len()
    }
}

/// (file with its directory, line, column).
fn code_info(ci: &blazesym::symbolize::CodeInfo<'_>) -> (String, u32, u32) {
    let file = match &ci.dir {
        Some(d) if !d.as_os_str().is_empty() => d.join(&*ci.file).display().to_string(),
        _ => PathBuf::from(&*ci.file).display().to_string(),
    };
    (
        file,
        ci.line.unwrap_or(0),
        u32::from(ci.column.unwrap_or(0)),
    )
}

fn new_symbolizer(debug_dirs: &[PathBuf]) -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        .set_debug_dirs(Some(debug_dirs))
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build()
}

/// Bytes a cached place accounts for.
fn place_bytes(place: &Place) -> u64 {
    (std::mem::size_of::<Place>()
        + place.function.as_ref().map_or(0, String::len)
        + place.file.as_ref().map_or(0, String::len)
        + place.module.as_ref().map_or(0, String::len)) as u64
}

fn worker(symbols: std::sync::Weak<Symbols>, rx: mpsc::Receiver<Msg>, debug_dirs: Vec<PathBuf>) {
    // blazesym keeps each module it parsed open and parsed: it is dropped
    // (and rebuilt empty) when a module is no longer used by any image.
    let mut symbolizer = new_symbolizer(&debug_dirs);
    // Module-relative places, by file and link-time address.
    let mut places: HashMap<(FileKey, u64), Arc<Place>> = HashMap::new();
    // The images each module was symbolized for.
    let mut users: HashMap<FileKey, Vec<std::sync::Weak<Image>>> = HashMap::new();
    while let Ok(msg) = rx.recv() {
        let Some(symbols) = symbols.upgrade() else {
            return;
        };
        let job = match msg {
            Msg::Locate(job) => job,
            Msg::Sweep => {
                let before = users.len();
                users.retain(|_, images| {
                    images.retain(|w| {
                        w.upgrade()
                            .is_some_and(|i| !i.retired.load(Ordering::Acquire))
                    });
                    !images.is_empty()
                });
                if users.len() < before {
                    places.retain(|(key, _), p| {
                        let keep = users.contains_key(key);
                        if !keep {
                            symbols.locator.places.fetch_sub(1, Ordering::Relaxed);
                            symbols
                                .locator
                                .place_bytes
                                .fetch_sub(place_bytes(p), Ordering::Relaxed);
                        }
                        keep
                    });
                    symbolizer = new_symbolizer(&debug_dirs);
                }
                continue;
            }
        };
        let image = &job.image;
        let mut for_now: Vec<(u64, Arc<Place>)> = Vec::new();
        // The addresses not cached yet, by module.
        let mut by_file: HashMap<FileKey, (MappedFile, Vec<u64>)> = HashMap::new();
        for &a in &job.lookups {
            if image.cached(a).is_some() {
                continue;
            }
            match image.file_at(a) {
                Some(f) => {
                    let key = FileKey {
                        dev: f.dev.clone(),
                        inode: f.inode,
                    };
                    by_file
                        .entry(key)
                        .or_insert_with(|| (f, Vec::new()))
                        .1
                        .push(a);
                }
                None => {
                    image.put(a, Arc::new(Place::default()));
                }
            }
        }
        for (key, (f, addrs)) in by_file {
            let seen = users.entry(key.clone()).or_default();
            if !seen
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(image)))
            {
                seen.retain(|w| w.strong_count() > 0);
                seen.push(Arc::downgrade(image));
            }
            let elf = match symbols.files.file_within(image.pid, &f, EVENT_WAIT) {
                Ok(e) => Some(e),
                Err(LoadError::Unreadable(e)) => {
                    tracing::debug!(pid = image.pid, error = %e, "module not symbolized");
                    None
                }
                Err(e) => {
                    // Not loaded yet: the module only, for now, not kept.
                    tracing::debug!(pid = image.pid, error = %e, "hits go out unsymbolized");
                    let p = Arc::new(Place {
                        module: Some(f.path.clone()),
                        ..Place::default()
                    });
                    for_now.extend(addrs.iter().map(|&a| (a, p.clone())));
                    continue;
                }
            };
            let bias = elf
                .as_ref()
                .and_then(|e| f.mappings.first().and_then(|m| e.bias(m.start, m.offset)))
                .unwrap_or(0);
            let build_id: Option<Arc<[u8]>> = elf
                .as_ref()
                .and_then(|e| e.build_id.as_deref().map(Arc::from));
            let mut todo: Vec<(u64, u64)> = Vec::new(); // (abs, vaddr)
            for &a in &addrs {
                let v = a.wrapping_sub(bias);
                match places.get(&(key.clone(), v)) {
                    Some(p) => {
                        image.put(a, p.clone());
                    }
                    None => todo.push((a, v)),
                }
            }
            if todo.is_empty() {
                continue;
            }
            // The file the loader checked and holds open: the separate debug
            // file when one was found (it has the module's addresses, its
            // symbol table and its DWARF), else the module; its DWARF read
            // only when it names no other file. A module that could not be
            // read is not symbolized (its place names the module only).
            let found = match elf.as_ref() {
                Some(e) => {
                    let (path, dwarf) = e.symbolizer_source();
                    let mut src = blazesym::symbolize::source::Elf::new(&path);
                    src.debug_syms = dwarf;
                    let src = blazesym::symbolize::source::Source::Elf(src);
                    let vaddrs: Vec<u64> = todo.iter().map(|(_, v)| *v).collect();
                    symbolizer
                        .symbolize(&src, blazesym::symbolize::Input::VirtOffset(&vaddrs))
                        .unwrap_or_default()
                }
                None => Vec::new(),
            };
            for (i, (a, v)) in todo.iter().enumerate() {
                let mut place = Place {
                    module: Some(f.path.clone()),
                    build_id: build_id.clone(),
                    module_address: *v,
                    file_offset: elf.as_ref().and_then(|e| e.file_offset(*v)),
                    ..Place::default()
                };
                if let Some(blazesym::symbolize::Symbolized::Sym(s)) = found.get(i) {
                    // blazesym reports the outer function with the line of
                    // the call it inlined, then each inlined function,
                    // outermost first, with its own line: the code at the
                    // address is the last one's.
                    let mut chain: Vec<(String, Option<CodeAt>)> =
                        vec![(s.name.to_string(), s.code_info.as_deref().map(code_info))];
                    chain.extend(
                        s.inlined
                            .iter()
                            .map(|f| (f.name.to_string(), f.code_info.as_ref().map(code_info))),
                    );
                    let (name, at) = chain.pop().expect("one entry at least");
                    place.function = Some(name);
                    place.function_offset = s.offset as u64;
                    if let Some((file, line, column)) = at {
                        place.file = Some(file);
                        place.line = line;
                        place.column = column;
                    }
                    // The functions it was inlined into, innermost first,
                    // each with the line of the inlined call.
                    place.inlined = chain
                        .into_iter()
                        .rev()
                        .map(|(f, at)| match at {
                            Some((file, line, _)) => (f, Some(file), line),
                            None => (f, None, 0),
                        })
                        .collect();
                }
                if let Some((stub, off)) =
                    elf.as_ref().and_then(|e| super::plt::stub_at(&e.plt, *v))
                {
                    // Not the symbol before it (`_init`): the stub's own name.
                    place.function = Some(stub.name.clone());
                    place.function_offset = off;
                    place.inlined.clear();
                }
                symbols.locator.places.fetch_add(1, Ordering::Relaxed);
                symbols
                    .locator
                    .place_bytes
                    .fetch_add(place_bytes(&place), Ordering::Relaxed);
                let p = Arc::new(place);
                places.insert((key.clone(), *v), p.clone());
                image.put(*a, p);
            }
        }
        let _ = job.reply.send(for_now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_finds_what_was_cached_once_anything_is() {
        let image = Image::new(1);
        assert!(image.cached(0x1000).is_none(), "nothing cached");
        assert!(cached_frame(&image, 0x1001).is_none());
        let place = Arc::new(Place {
            function: Some("f".into()),
            ..Place::default()
        });
        image.insert_for_tests(0x1000, place.clone());
        assert_eq!(image.cached(0x1000), Some(place.clone()));
        assert!(image.cached(0x2000).is_none(), "another address");
        let f = cached_frame(&image, 0x1001).expect("cached at ip - 1");
        assert_eq!((f.ip, f.lookup, &f.place), (0x1001, 0x1000, &place));
        // The images of other processes (or of this one before an exec)
        // are their own.
        assert!(Image::new(1).cached(0x1000).is_none());
    }

    /// A hit in a module whose load has not finished within the wait goes
    /// out at once naming its module only, and nothing is kept for it: a
    /// later hit, once the module is loaded, gets its place.
    #[tokio::test]
    async fn a_hit_in_a_module_still_loading_names_the_module_only() {
        let symbols = Arc::new(Symbols::new());
        let me = std::process::id() as Pid;
        let exe = super::super::resolve::exe_key(me).expect("this process's executable");
        let exe_file = maps::read(me)
            .unwrap()
            .into_iter()
            .find(|f| FileKey::of(f) == exe)
            .expect("the executable is mapped");
        let ip = exe_file
            .mappings
            .iter()
            .find(|m| m.exec)
            .expect("code")
            .start
            + 0x11;
        super::super::files::tests::stall(
            &symbols.files,
            exe,
            EVENT_WAIT + std::time::Duration::from_secs(1),
        );
        let image = Image::new(me);
        let t = std::time::Instant::now();
        let frames = symbols.frames(&image, &[ip]).await;
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(
            frames[0].place.module.as_deref(),
            Some(exe_file.path.as_str())
        );
        assert_eq!(frames[0].place.function, None);
        assert!(image.cached(ip - 1).is_none(), "not kept");
        assert_eq!(symbols.symbolizer_threads(), 1);
    }
}
