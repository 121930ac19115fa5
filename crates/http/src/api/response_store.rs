//! Stored responses for `previous_response_id`: each response kept with
//! `store` (the default) is its conversation as chat messages (input and
//! output, without `instructions`), in memory and bounded: the newest
//! [`MAX_STORED`] responses within [`MAX_STORED_BYTES`] of messages, the
//! oldest dropped first. Nothing outlives the process.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value as Json;

/// How many responses are kept.
pub const MAX_STORED: usize = 1000;
/// How many bytes of messages (as JSON text) are kept in all.
pub const MAX_STORED_BYTES: usize = 64 << 20;

#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Ids, oldest first.
    order: VecDeque<String>,
    kept: HashMap<String, (Vec<Json>, usize)>,
    bytes: usize,
}

impl ResponseStore {
    /// The conversation of response `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Vec<Json>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.kept.get(id).map(|(messages, _)| messages.clone())
    }

    /// Keeps `messages` as response `id`'s conversation, dropping the
    /// oldest responses over the bounds (one larger than the byte bound
    /// alone is not kept).
    pub fn put(&self, id: String, messages: Vec<Json>) {
        let size: usize = messages.iter().map(|m| m.to_string().len()).sum();
        if size > MAX_STORED_BYTES {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while inner.order.len() >= MAX_STORED || inner.bytes + size > MAX_STORED_BYTES {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, freed)) = inner.kept.remove(&oldest) {
                inner.bytes -= freed;
            }
        }
        inner.order.push_back(id.clone());
        inner.kept.insert(id, (messages, size));
        inner.bytes += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest() {
        let store = ResponseStore::default();
        for i in 0..MAX_STORED + 5 {
            store.put(format!("resp_{i}"), vec![Json::from(i)]);
        }
        assert!(store.get("resp_4").is_none());
        assert_eq!(store.get("resp_5"), Some(vec![Json::from(5)]));
        assert!(store.get(&format!("resp_{}", MAX_STORED + 4)).is_some());
    }
}
