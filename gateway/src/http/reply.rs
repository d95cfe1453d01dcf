//! Owns the gateway's answers: a status code, a JSON body whose errors are
//! always `{"error": "<stable_code>", ...}`, and the few headers we send
//! (`Content-Type`, `Retry-After`, `Allow`). Nothing internal is ever put in
//! a body: Redis errors are logged, the client sees `unavailable`.

use serde_json::json;
use tiny_http::{Header, Response};

/// Seconds a client should wait before retrying a 503 or 429 (`Retry-After`).
pub const RETRY_AFTER_S: &str = "1";

/// One HTTP answer, built by a route and written by the handler loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// The body (JSON, or the Prometheus text for `/metrics`).
    pub body: String,
    /// `Content-Type` of the body.
    pub content_type: &'static str,
    /// Extra header, e.g. `("Retry-After", "1")` or `("Allow", "POST")`.
    pub extra: Option<(&'static str, &'static str)>,
}

const JSON: &str = "application/json";

impl Reply {
    /// A JSON reply.
    pub fn json(status: u16, body: serde_json::Value) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            content_type: JSON,
            extra: None,
        }
    }

    /// A JSON object of string members, written as serde_json writes a
    /// `json!` map (members in key order: give `members` sorted by key)
    /// but without building a `serde_json::Value`: the purchase answers
    /// are written once per purchase.
    pub fn object(status: u16, members: &[(&'static str, &str)]) -> Reply {
        let mut body = String::with_capacity(96);
        body.push('{');
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            // Keys are the gateway's own names (`error`, `reservation_id`,
            // ...): written as they are, no escape check.
            debug_assert!(key.bytes().all(|b| PLAIN[usize::from(b)]), "{key}");
            body.push('"');
            body.push_str(key);
            body.push_str("\":");
            push_json_str(&mut body, value);
        }
        body.push('}');
        Reply {
            status,
            body,
            content_type: JSON,
            extra: None,
        }
    }

    /// `{"error": code}` with `status`.
    pub fn error(status: u16, code: &str) -> Reply {
        Reply::object(status, &[("error", code)])
    }

    /// 400 `{"error": "invalid_request", "detail": detail}`.
    pub fn invalid(detail: &str) -> Reply {
        Reply::json(400, json!({ "error": "invalid_request", "detail": detail }))
    }

    /// 404 `{"error": "not_found"}`: no such route.
    pub fn not_found() -> Reply {
        Reply::error(404, "not_found")
    }

    /// 404 `{"error": "sale_not_found"}`.
    pub fn sale_not_found() -> Reply {
        Reply::error(404, "sale_not_found")
    }

    /// 405 `{"error": "method_not_allowed"}` with `Allow: allow`.
    pub fn method_not_allowed(allow: &'static str) -> Reply {
        let mut r = Reply::error(405, "method_not_allowed");
        r.extra = Some(("Allow", allow));
        r
    }

    /// 413 `{"error": "payload_too_large"}`.
    pub fn payload_too_large() -> Reply {
        Reply::error(413, "payload_too_large")
    }

    /// 503 `{"error": "sale_paused"}` with `Retry-After`: the sale is
    /// paused until an operator repairs it (Redis lost data of it; see
    /// `seckill-reconciler sale repair`) or resumes it (`sale pause`,
    /// `sale resume`). Nothing was reserved.
    pub fn sale_paused() -> Reply {
        let mut r = Reply::error(503, "sale_paused");
        r.extra = Some(("Retry-After", RETRY_AFTER_S));
        r
    }

    /// 503 `{"error": "unavailable"}` with `Retry-After: 1`: Redis cannot be
    /// reached or the gateway is saturated.
    pub fn unavailable() -> Reply {
        let mut r = Reply::error(503, "unavailable");
        r.extra = Some(("Retry-After", RETRY_AFTER_S));
        r
    }

    /// 503 `{"error": "unavailable", "reason": reason}` with `Retry-After:
    /// 1`: `/readyz`'s answer when Redis would not take a purchase now
    /// (`queries::ready` lists the reasons).
    pub fn not_ready(reason: &str) -> Reply {
        let mut r = Reply::json(503, json!({ "error": "unavailable", "reason": reason }));
        r.extra = Some(("Retry-After", RETRY_AFTER_S));
        r
    }

    /// 429 `{"error": "too_many_requests"}` with `Retry-After: 1`: the
    /// buyer's or the client address's share is used up (`limits.rs`;
    /// rates are whole requests per second, so a token is back within 1 s).
    pub fn too_many_requests() -> Reply {
        let mut r = Reply::error(429, "too_many_requests");
        r.extra = Some(("Retry-After", RETRY_AFTER_S));
        r
    }

    /// 503 `{"error": "overloaded"}` with `Retry-After: 1`: the gateway
    /// has as many purchases waiting for Redis as it takes (`shed.rs`).
    /// Nothing was sent to Redis.
    pub fn overloaded() -> Reply {
        let mut r = Reply::error(503, "overloaded");
        r.extra = Some(("Retry-After", RETRY_AFTER_S));
        r
    }

    /// 200 with a plain-text body (health checks, metrics).
    pub fn text(status: u16, body: String, content_type: &'static str) -> Reply {
        Reply {
            status,
            body,
            content_type,
            extra: None,
        }
    }

    /// The tiny_http response for this reply.
    pub fn into_response(self) -> Response<std::io::Cursor<Vec<u8>>> {
        let mut r = Response::from_string(self.body).with_status_code(self.status);
        if let Ok(h) = Header::from_bytes("Content-Type", self.content_type) {
            r.add_header(h);
        }
        if let Some((name, value)) = self.extra {
            if let Ok(h) = Header::from_bytes(name, value) {
                r.add_header(h);
            }
        }
        r
    }
}

/// The bytes a JSON string holds as they are (printable ASCII but `"` and
/// `\`), one lookup per byte.
const PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0x20;
    while i < 0x7f {
        t[i] = i != b'"' as usize && i != b'\\' as usize;
        i += 1;
    }
    t
};

/// Appends `s` as a JSON string: as it is when it needs no escape (the
/// codes and ids the gateway sends), else through serde_json.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| PLAIN[usize::from(b)]) {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(s).to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_written_as_serde_json_writes_them() {
        for members in [
            vec![("error", "sold_out")],
            vec![("reservation_id", "00ff"), ("status", "queued")],
            vec![("error", "a\"b\\c\u{1}\u{7f}é"), ("x", "")],
        ] {
            let map: serde_json::Map<String, serde_json::Value> = members
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect();
            assert_eq!(
                Reply::object(200, &members).body,
                serde_json::Value::Object(map).to_string()
            );
        }
    }

    #[test]
    fn errors_have_a_stable_code_and_nothing_else() {
        assert_eq!(
            Reply::error(410, "sold_out").body,
            r#"{"error":"sold_out"}"#
        );
        let u = Reply::unavailable();
        assert_eq!((u.status, u.extra), (503, Some(("Retry-After", "1"))));
        let i = Reply::invalid("empty body");
        assert_eq!(
            i.body,
            r#"{"detail":"empty body","error":"invalid_request"}"#
        );
    }
}
