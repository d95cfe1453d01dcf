//! The `seckill-gateway` binary: the command line and the exit code around
//! `seckill_gateway::server::run` (the crate doc has the layout).
#![forbid(unsafe_code)]

use seckill_common::start;
use seckill_gateway::config::Settings;
use seckill_gateway::http::listener::Unblocker;
use seckill_gateway::server;
use std::process::ExitCode;

/// `seckill-gateway --help`.
const USAGE: &str = "\
usage: seckill-gateway

The flash-sale gateway: HTTP purchases reserved in Redis by one script,
order messages queued for the workers. No arguments: it is configured by
SECKILL_* environment variables (README, \"Configuration\"), chiefly
SECKILL_LISTEN (127.0.0.1:8080), SECKILL_REDIS_URL, SECKILL_AUTH and
SECKILL_AUTH_KEYS (a JWKS file of buyer-token keys), SECKILL_PAYMENT_SECRET.
SIGHUP reads SECKILL_AUTH_KEYS again (a bad file keeps the keys in use).
Exit codes: 0 stopped by SIGTERM/SIGINT, 1 failed while running, 2 bad
configuration, a port that cannot be listened on or a Redis that refuses
the password, 64 bad command line.";

fn main() -> ExitCode {
    if let Some(code) = start::command_line("seckill-gateway", USAGE) {
        return code;
    }
    let unblocker = Unblocker::default();
    let on_signal = unblocker.clone();
    let started = match start::start_reloading(move || on_signal.unblock_all()) {
        Ok(s) => s,
        Err(e) => return start::fail("seckill-gateway", &e, e.exit_code()),
    };
    // The gateway's own variables, checked after the shared ones.
    let settings = match Settings::from_env(&started.config) {
        Ok(s) => s,
        Err(e) => return start::fail("seckill-gateway", &e, start::EXIT_CONFIG),
    };
    let result = server::run(settings, started.shutdown, started.reload, unblocker).map(|()| 0);
    start::finish("seckill-gateway", result, server::GatewayError::exit_code)
}
