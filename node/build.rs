//! Does nothing itself: it is here so that its build-dependency `mesh-toolchain-check`, pulled
//! in by the `embedded` feature, runs before anything of llama.cpp is built (why, in
//! node/toolchain-check/build.rs).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
