//! Compiles `wpd/v1/*.proto` with protox (pure Rust: no system `protoc`).
//!
//! Two passes: the messages and the client, then the server alone, with
//! every message taken from the first pass except the one `StreamEvents`
//! sends, which is [`StreamEventsItem`](src/stream.rs) (a message or the
//! bytes of one already encoded).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["wpd/v1/wpd.proto", "wpd/v1/state.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("wpd_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds.clone())?;
    let server = out.join("server");
    std::fs::create_dir_all(&server)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .out_dir(&server)
        .extern_path(".wpd.v1", "crate::v1")
        .extern_path(
            ".wpd.v1.StreamEventsResponse",
            "crate::v1::StreamEventsItem",
        )
        .compile_fds(fds)?;
    Ok(())
}
