//! The front door's request parsing: the first byte picks what is read, the rest is the input.
//! `0`: a `POST /v1/chat/completions` body (`read_chat_completion`: OpenAI JSON → messages,
//! tools, tool choice, response format, generation settings, target); a body it accepts must travel to another node and back
//! unchanged (the JSON inside `Models.Chat`), and its target must print and parse back to
//! itself. `1`: an `Authorization` header value (`bearer`). Every input answers a value or an
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_domain::{ChatRequest, Target};
use mesh_node::{
    config::UnknownFields,
    http::{bearer, clients::Unknown, read_chat_completion},
};

fuzz_target!(|data: &[u8]| {
    let Some((kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 2 {
        0 => {
            if let Ok(read) = read_chat_completion(bytes, &mut Unknown::new(UnknownFields::Ignore)) {
                let call = read.call;
                let wire = serde_json::to_vec(&call.chat).expect("a read chat encodes");
                let back: ChatRequest = serde_json::from_slice(&wire).expect("and decodes");
                assert_eq!(back, call.chat, "a chat changed on its way between nodes");
                let printed = call.target.to_string();
                let reparsed: Result<Target, _> = printed.parse();
                if let Ok(reparsed) = reparsed {
                    assert_eq!(reparsed, call.target, "{printed:?} parsed back differently");
                }
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(bytes) {
                if let Some(token) = bearer(text) {
                    assert!(text.len() >= token.len());
                }
            }
        }
    }
});
