//! Config parsing and validation: any text is either a config or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_node::config::{Overrides, RawConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(raw) = RawConfig::parse(text, std::path::Path::new("fuzz.toml")) {
        let _ = raw.validate(None, &Overrides::default());
    }
});
