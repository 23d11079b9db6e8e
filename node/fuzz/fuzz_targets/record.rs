//! Stored memory records: any bytes decode to a record or an error, never a panic, and a
//! record that decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_node::memory::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        assert_eq!(
            record.encode(),
            data,
            "decode then encode changed the bytes"
        );
        assert_eq!(Record::decode(&record.encode()).ok(), Some(record));
    }
});
