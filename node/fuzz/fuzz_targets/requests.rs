//! Network messages → domain values: the first byte picks a message type, the rest is its
//! protobuf encoding. Every conversion answers a value or
//! an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_domain::{ChatRequest, NodeInfo, TaskEvent, TaskSpec};
use mesh_node::{
    cron::{Overlap, Timetable, check_name},
    memory::Entry,
};
use mesh_proto::v1 as pb;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 6 {
        0 => {
            if let Ok(m) = pb::SubmitRequest::decode(bytes) {
                let _ = TaskSpec::try_from(m);
            }
        }
        1 => {
            if let Ok(m) = pb::MemoryRecord::decode(bytes) {
                let _ = Entry::try_from(m);
            }
        }
        2 => {
            if let Ok(m) = pb::NodeInfo::decode(bytes) {
                let _ = NodeInfo::try_from(m);
            }
        }
        3 => {
            if let Ok(m) = pb::TaskEvent::decode(bytes) {
                let _ = TaskEvent::try_from(m);
            }
        }
        4 => {
            // Models.Chat: the request, its tools' schemas as JSON text, and its settings.
            if let Ok(call) = pb::ChatCall::decode(bytes)
                && let Ok(chat) = ChatRequest::try_from(call.request.unwrap_or_default())
            {
                let _ = chat.sampling.check();
            }
        }
        _ => {
            // Cron.Add: name, expression and zone, overlap, and the task.
            if let Ok(r) = pb::CronAddRequest::decode(bytes) {
                let _ = check_name(&r.name);
                let _ = Timetable::parse(&r.schedule, &r.timezone);
                let _ = r.overlap.parse::<Overlap>();
                if let Some(task) = r.task {
                    let _ = TaskSpec::try_from(task);
                }
            }
        }
    }
});
