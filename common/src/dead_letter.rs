//! Owns the dead-letter entry: what the worker writes to a sale's
//! dead-letter list (`seckill:{sale:ID}:dlq`) and the reconciler reads.
//!
//! Shape, one line of JSON:
//! `{"message":"<the raw queued text>","reason":"...","attempts":5,"worker":"w1","at_ms":1764400000000,"reservation_id":"..."}`
//! `reservation_id` is absent when the message could not be parsed.

use serde::{Deserialize, Serialize};

/// One message given up on, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The queued message exactly as it was (lossy UTF-8 if it was not text).
    pub message: String,
    /// Why it was given up on, e.g. `malformed order message: ...`,
    /// `unknown sale 9`, `stock exhausted in MySQL`, `max attempts`.
    pub reason: String,
    /// Failed applications counted for it (0 for an unparseable message).
    pub attempts: u32,
    /// The worker that dead-lettered it.
    pub worker: String,
    /// When, Unix ms (worker clock).
    pub at_ms: u64,
    /// The reservation id when the message could be parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
}

impl DeadLetter {
    /// The JSON text stored in the list.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an entry; `None` if it is not one (a foreign push).
    pub fn parse(raw: &[u8]) -> Option<DeadLetter> {
        serde_json::from_slice(raw).ok()
    }
}
