//! Compiles `agentmesh/v1/*.proto` with protox (pure Rust), so no system `protoc` is needed.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("agentmesh/v1");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=agentmesh");

    let fds = protox::compile(&files, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out.join("agentmesh_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
