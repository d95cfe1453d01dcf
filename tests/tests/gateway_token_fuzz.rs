//! Specifies that no bytes in a bearer token get past the gateway's check
//! or stop it: 10,000 tokens (every truncation of a valid HS256 and EdDSA
//! token, random visible ASCII, random base64url with dots, and a valid
//! header over a random payload and signature) are each answered 401
//! `invalid_token` on keep-alive connections, no Redis script runs and the
//! sale's keys are unchanged; then the untruncated tokens still buy.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use seckill_common::token::Claims;
use seckill_tests::auth::{signer, ED_KID, HS_KID};
use seckill_tests::RedisServer;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

const SALE: u64 = 43;
const CASES: usize = 10_000;

/// xorshift64*: reproducible cases from a seed printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `len` characters drawn from `alphabet`.
    fn text(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len)
            .map(|_| alphabet[self.below(alphabet.len())] as char)
            .collect()
    }
}

/// The tokens sent: every truncation of `valid`'s tokens, then random ones
/// up to [`CASES`].
fn cases(valid: &[String], rng: &mut Rng) -> Vec<String> {
    let visible: Vec<u8> = (0x21..=0x7e).collect();
    let b64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.";
    let mut out: Vec<String> = valid
        .iter()
        .flat_map(|t| (1..t.len()).map(|n| t[..n].to_string()))
        .collect();
    while out.len() < CASES {
        let longest = if rng.below(50) == 0 { 5000 } else { 600 };
        let len = 1 + rng.below(longest);
        let token = match rng.below(3) {
            0 => rng.text(&visible, len),
            1 => rng.text(b64, len),
            _ => {
                // A real header (kid and alg of a valid token): the random
                // payload and signature reach the signature check.
                let t = &valid[rng.below(valid.len())];
                let head = t.split('.').next().unwrap_or_default();
                let payload = rng.text(&b64[..64], len);
                let sig_len = 1 + rng.below(400);
                let sig = rng.text(&b64[..64], sig_len);
                format!("{head}.{payload}.{sig}")
            }
        };
        out.push(token);
    }
    out
}

/// Sends a purchase with `token` on `conn` (reconnecting when the gateway
/// closed it) and returns the status.
fn buy_with(port: u16, conn: &mut Option<BufReader<TcpStream>>, token: &str) -> u16 {
    let rq = format!(
        "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    for _ in 0..2 {
        let c = conn.get_or_insert_with(|| {
            let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to gateway");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            BufReader::new(s)
        });
        if c.get_mut().write_all(rq.as_bytes()).is_ok() {
            if let Some(r) = read_resp(c) {
                if r.header("connection") == Some("close") {
                    *conn = None;
                }
                return r.status;
            }
        }
        *conn = None;
    }
    panic!("no answer to a purchase with token {token:?}");
}

#[test]
fn random_and_truncated_tokens_are_all_401_and_change_nothing() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 100);
    let mut g = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    let valid: Vec<String> = [HS_KID, ED_KID]
        .iter()
        .map(|kid| {
            signer(kid)
                .mint(&Claims::new("fuzz-buyer", "seckill", 600))
                .unwrap()
        })
        .collect();
    let seed = seckill_common::now_ms() | 1;
    let mut rng = Rng(seed);
    let tokens = cases(&valid, &mut rng);
    assert_eq!(tokens.len(), CASES);
    let (before, scripts_before) = (snapshot(&redis, SALE), evalsha_calls(&redis));
    let mut conn = None;
    let mut not_401 = Vec::new();
    for t in &tokens {
        let status = buy_with(g.port, &mut conn, t);
        if status != 401 {
            not_401.push((status, t.clone()));
        }
    }
    assert!(not_401.is_empty(), "seed {seed}: {not_401:?}");
    assert!(g.alive(), "the gateway died");
    assert_eq!(
        evalsha_calls(&redis),
        scripts_before,
        "seed {seed}: a script ran"
    );
    assert_eq!(snapshot(&redis, SALE), before, "seed {seed}: Redis changed");
    // The whole tokens were sound: the first buys, the second (the same
    // buyer) is told it already bought.
    assert_eq!(buy_with(g.port, &mut conn, &valid[0]), 202);
    assert_eq!(buy_with(g.port, &mut conn, &valid[1]), 409);
    assert_eq!(counts(&redis, SALE).0, 99);
}
