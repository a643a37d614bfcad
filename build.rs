//! Compiles `proto/exec_gateway/v1/*.proto` (and the fleet's relay protocol) with protox (a pure-Rust protobuf
//! compiler, so a fresh machine needs no system `protoc`) and generates the
//! tonic/prost code; also writes the descriptor set for server reflection.

use std::path::PathBuf;

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/exec_gateway/v1/session.proto",
    "proto/exec_gateway/v1/process.proto",
    "proto/exec_gateway/v1/file.proto",
    "proto/exec_gateway/v1/environment.proto",
];
/// Replica-to-replica (fleet) services: compiled, not reflected.
const FLEET_PROTOS: &[&str] = &["proto/exec_gateway/fleet/v1/relay.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PROTOS.iter().chain(FLEET_PROTOS) {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("exec_gateway_descriptor.bin"), fds.encode_to_vec())?;
    // `bytes` fields as `bytes::Bytes`: output chunks go out without a copy.
    tonic_prost_build::configure()
        .bytes(".exec_gateway.v1")
        .compile_fds(fds)?;
    let fleet = protox::compile(FLEET_PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".exec_gateway.fleet.v1")
        .compile_fds(fleet)?;
    Ok(())
}
