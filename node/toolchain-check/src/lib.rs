//! Empty: the check is this crate's build script (`build.rs`), which runs when mesh-node is built
//! with its `embedded` feature.
