//! Stored memory records: any bytes decode to a record or an error, never a panic; a record
//! that decodes encodes back to the same bytes (a version 1 record, stored before signatures,
//! encodes as the current version) and decodes again to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_node::memory::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data) {
        let encoded = record.encode();
        // Version 2 (with the signature) is what `encode` writes.
        if data.first() == Some(&2) {
            assert_eq!(encoded, data, "decode then encode changed the bytes");
        }
        assert_eq!(Record::decode(&encoded).ok(), Some(record));
    }
});
