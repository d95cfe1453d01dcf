//! Owns what a request presented as its buyer's proof ([`Credentials`]),
//! the longest token taken, and why a token is refused as the client reads
//! it ([`Refused`]): the words the identity rule and the verifier share.

/// Longest token taken, in bytes (4 KiB); a longer one is refused before
/// any decoding.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// What a request presented in its `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No `Authorization` header.
    Missing,
    /// One `Authorization: Bearer <token>` (the token, not yet checked).
    Bearer(String),
    /// Another scheme, an empty token or more than one header.
    Unusable,
}

/// Why a token was refused, as the client is told (401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `invalid_token`.
    Invalid,
    /// `token_expired`.
    Expired,
}
