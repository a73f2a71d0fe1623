//! Writes the hand-made seeds of both fuzz targets into `corpus/<target>/`
//! as `seed-<name>` files (or into `regressions/<target>/` when a seed trips
//! a check: a known bug's reproducer), and removes grown corpus files that
//! duplicate a seed byte for byte. Idempotent; run from anywhere:
//!
//!     cargo run --manifest-path daemon/fuzz/Cargo.toml --example gen_seeds
//!
//! Every seed is also run through its target's checks before it is written,
//! and each `status_mapping` seed is verified to decode to the variant it
//! is named after.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use arbitrary::{Arbitrary, Unstructured};
use wpd_fuzz::request::{self, Kind, frame};
use wpd_fuzz::status::{self, ErrorInput};
use wpd_proto::v1 as pb;

fn spec(pid: i32, address: u64, length: u32, access: pb::Access) -> pb::WatchpointSpec {
    pb::WatchpointSpec {
        pid,
        address,
        length,
        access: access as i32,
        ..Default::default()
    }
}

fn set(s: pb::WatchpointSpec) -> Vec<u8> {
    frame(
        Kind::SetWatchpoint,
        &pb::SetWatchpointRequest { spec: Some(s) },
    )
}

fn decode_spec_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use pb::Access::{Exec, Read, ReadWrite, Unspecified, Write};
    let w8 = spec(1, 0x1000, 8, Write);
    let mut v = vec![
        // Accepted.
        ("set-write8", set(w8.clone())),
        (
            "set-rw4-threads-unsorted-dup",
            set(pb::WatchpointSpec {
                tids: vec![5, 3, 5],
                ..spec(4242, 0x7ffc_0000_1004, 4, ReadWrite)
            }),
        ),
        (
            "set-exec1-odd-ptrace-stopall-change",
            set(pb::WatchpointSpec {
                backend: pb::Backend::Ptrace as i32,
                action: pb::HitAction::StopAll as i32,
                only_on_change: true,
                ..spec(7, 0x40_1001, 1, Exec)
            }),
        ),
        (
            "set-last-user-qword",
            set(spec(1, 0x7fff_ffff_eff8, 8, Write)),
        ),
        ("set-address-zero", set(spec(1, 0, 2, Write))),
        // Refused.
        ("set-user-end", set(spec(1, 0x7fff_ffff_f000, 8, Write))),
        (
            "set-straddles-end",
            set(spec(1, 0x7fff_ffff_effc, 8, Write)),
        ),
        (
            "set-kernel-half",
            set(spec(1, 0xffff_ffff_8100_0000, 8, Write)),
        ),
        ("set-non-canonical", set(spec(1, 1 << 47, 8, Write))),
        ("set-max-address", set(spec(1, u64::MAX, 1, Write))),
        ("set-misaligned", set(spec(1, 0x1004, 8, Write))),
        ("set-length3", set(spec(1, 0x1000, 3, Write))),
        ("set-length0", set(spec(1, 0x1000, 0, Write))),
        ("set-exec-length2", set(spec(1, 0x1000, 2, Exec))),
        ("set-read-only", set(spec(1, 0x1000, 8, Read))),
        ("set-no-access", set(spec(1, 0x1000, 8, Unspecified))),
        (
            "set-access-99",
            set(pb::WatchpointSpec {
                access: 99,
                ..w8.clone()
            }),
        ),
        (
            "set-pid0",
            set(pb::WatchpointSpec {
                pid: 0,
                ..w8.clone()
            }),
        ),
        (
            "set-pid-neg",
            set(pb::WatchpointSpec {
                pid: -1,
                ..w8.clone()
            }),
        ),
        (
            "set-tid-neg",
            set(pb::WatchpointSpec {
                tids: vec![3, -1],
                ..w8.clone()
            }),
        ),
        (
            "set-backend7",
            set(pb::WatchpointSpec {
                backend: 7,
                ..w8.clone()
            }),
        ),
        (
            "set-action42",
            set(pb::WatchpointSpec {
                action: 42,
                ..w8.clone()
            }),
        ),
        (
            "set-no-spec",
            frame(
                Kind::SetWatchpoint,
                &pb::SetWatchpointRequest { spec: None },
            ),
        ),
        // Other requests.
        (
            "attach-ptrace",
            frame(
                Kind::Attach,
                &pb::AttachRequest {
                    pid: 99,
                    backend: 2,
                    ..Default::default()
                },
            ),
        ),
        (
            "attach-bad",
            frame(
                Kind::Attach,
                &pb::AttachRequest {
                    pid: i32::MIN,
                    backend: -3,
                    ..Default::default()
                },
            ),
        ),
        (
            "list-threads-probe",
            frame(
                Kind::ListThreads,
                &pb::ListThreadsRequest {
                    pid: 12,
                    tids: vec![12, 13, -4],
                    probe: true,
                },
            ),
        ),
        (
            "resume-some",
            frame(
                Kind::Resume,
                &pb::ResumeRequest {
                    pid: 5,
                    tids: vec![6, 7],
                },
            ),
        ),
        (
            "stream-events",
            frame(
                Kind::StreamEvents,
                &pb::StreamEventsRequest {
                    pid: -1,
                    watchpoint_ids: vec![1, u64::MAX],
                    hits_only: true,
                    raw: true,
                    lease: false,
                    ..Default::default()
                },
            ),
        ),
        (
            "pause",
            frame(
                Kind::Pause,
                &pb::PauseRequest {
                    pid: 7,
                    tids: vec![8, 0],
                    lease: 3,
                },
            ),
        ),
        (
            "thread-stack-deep",
            frame(
                Kind::GetThreadStack,
                &pb::GetThreadStackRequest {
                    pid: 7,
                    tid: 8,
                    depth: 129,
                    raw: false,
                    locals: false,
                },
            ),
        ),
        (
            "read-memory-at-the-end",
            frame(
                Kind::ReadMemory,
                &pb::ReadMemoryRequest {
                    pid: 7,
                    address: 0x7fff_ffff_eff0,
                    length: 16,
                },
            ),
        ),
    ];
    // Malformed wire data.
    let mut truncated = set(w8.clone());
    truncated.truncate(truncated.len() - 1);
    v.push(("set-truncated", truncated));
    // Field 3 (address) sent twice and the tids unpacked: last wins, both merge.
    let mut twice = set(w8);
    twice.extend_from_slice(&[0x0a, 0x05, 0x18, 0x80, 0x40, 0x10, 0x03]);
    v.push(("set-spec-twice", twice));
    v.push(("set-bad-wire-type", vec![0, 0x0f, 0x01]));
    v.push((
        "set-overlong-varint",
        vec![
            0, 0x0a, 0x0b, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ],
    ));
    v.push(("empty-after-selector", vec![3]));
    v
}

/// Bytes after the variant tag, per target variant: texts that stress the
/// message (Unicode, controls, percent signs) and fields at their limits.
fn status_payloads() -> Vec<(&'static str, Vec<u8>)> {
    let text = "pid ∞ — \u{202e}evil\u{202c}\n\r\t\0 100% 🦀".as_bytes();
    let mut awkward = vec![0xff; 8];
    awkward.extend_from_slice(text);
    vec![("text", text.to_vec()), ("ones", awkward)]
}

/// One seed per `ErrorInput` variant and payload: the tag bytes are found by
/// search (how `arbitrary` encodes an enum tag is its business) and checked.
fn status_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut seen_variants = HashSet::new();
    for (pname, payload) in status_payloads() {
        let mut seen_here = HashSet::new();
        for tag in 0..=u8::MAX {
            for pos in 0..4 {
                let mut bytes = vec![0u8; 4];
                bytes[pos] = tag;
                bytes.extend_from_slice(&payload);
                let Ok(input) = ErrorInput::arbitrary_take_rest(Unstructured::new(&bytes)) else {
                    continue;
                };
                let name = status::variant(&input.clone().build());
                if seen_here.insert(name) {
                    seen_variants.insert(name);
                    out.push((format!("{name}-{pname}"), bytes));
                }
            }
        }
    }
    assert_eq!(seen_variants.len(), 24, "some WpdError variant has no seed");
    out
}

fn write_dir(
    dir: &Path,
    regressions: &Path,
    seeds: &[(String, Vec<u8>)],
    check: impl Fn(&[u8]) + std::panic::RefUnwindSafe,
) {
    std::fs::create_dir_all(dir).unwrap();
    let contents: HashSet<&[u8]> = seeds.iter().map(|(_, b)| b.as_slice()).collect();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("seed-") && contents.contains(std::fs::read(&p).unwrap().as_slice()) {
            std::fs::remove_file(&p).unwrap();
        }
    }
    let mut passing = 0;
    for (name, bytes) in seeds {
        // A seed that trips a check is a reproducer, not corpus: it goes to
        // regressions/<target>/, which fuzz-smoke replays too.
        let file = format!("seed-{name}");
        let _ = std::fs::remove_file(dir.join(&file));
        let _ = std::fs::remove_file(regressions.join(&file));
        match std::panic::catch_unwind(|| check(bytes)) {
            Ok(()) => {
                std::fs::write(dir.join(&file), bytes).unwrap();
                passing += 1;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("?");
                eprintln!("WARNING: {file} fails its target's checks: {msg}");
                std::fs::create_dir_all(regressions).unwrap();
                std::fs::write(regressions.join(&file), bytes).unwrap();
            }
        }
    }
    println!(
        "{}: {passing} seeds pass; {} failing ones in {}",
        dir.display(),
        seeds.len() - passing,
        regressions.display()
    );
}

fn main() {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (root, reg) = (here.join("corpus"), here.join("regressions"));
    let decode: Vec<_> = decode_spec_seeds()
        .into_iter()
        .map(|(n, b)| (n.to_string(), b))
        .collect();
    write_dir(
        &root.join("decode_spec"),
        &reg.join("decode_spec"),
        &decode,
        request::check,
    );
    write_dir(
        &root.join("status_mapping"),
        &reg.join("status_mapping"),
        &status_seeds(),
        |b| {
            if let Ok(i) = ErrorInput::arbitrary_take_rest(Unstructured::new(b)) {
                status::check_input(i);
            }
        },
    );
}
