//! Owns the process: the listening socket (with the send timeout and TCP
//! keep-alive every client connection inherits), the tiny_http server
//! (each request handled on its connection's thread), the group-commit
//! Redis threads, readiness, and the orderly stop on SIGTERM (requests
//! being handled and purchases in a pipeline answered, exit 0).

use crate::app::App;
use crate::buyers;
use crate::group_commit::{self, QUEUE_CAPACITY};
use crate::handler::handle;
use crate::identity::Identity;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::redis_link::LinkPool;
use crate::redis_link::{Link, BACKOFF_MAX};
use crate::reserver::Reserver;
use crate::shed::Shed;
use crate::soldout::SoldOutCache;
use seckill_common::redis_target::Target;
use seckill_common::shutdown::Reload;
use seckill_common::{Config, Shutdown};
use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiny_http::Server;

/// Longest wait at stop for requests being handled and purchases still in
/// a Redis pipeline.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// Pending connections the kernel keeps for the accept thread: a crowd
/// behind nginx opens thousands of gateway connections at once. The kernel
/// caps it at `net.core.somaxconn` (4,096 by default).
pub const LISTEN_BACKLOG: i32 = 4096;

/// Why the gateway could not run. [`GatewayError::exit_code`] maps each to
/// the documented exit code (2: cannot start, 1: failed while running).
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// `SECKILL_REDIS_URL` is not a usable Redis URL.
    RedisUrl(redis::RedisError),
    /// The listen address cannot be bound.
    Bind(SocketAddr, std::io::Error),
    /// tiny_http refused the listener.
    Server(String),
    /// A thread could not be started.
    Thread(std::io::Error),
    /// The accept loop stopped (e.g. out of file descriptors).
    Accept(String),
    /// The identity settings cannot be used (no key file with `jwt`...).
    Identity(crate::identity::IdentityError),
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayError::RedisUrl(e) => write!(f, "redis url: {e}"),
            GatewayError::Bind(a, e) => write!(f, "cannot listen on {a}: {e}"),
            GatewayError::Server(e) => write!(f, "http server: {e}"),
            GatewayError::Thread(e) => write!(f, "starting a thread: {e}"),
            GatewayError::Accept(e) => write!(f, "accepting connections: {e}"),
            GatewayError::Identity(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for GatewayError {}

impl GatewayError {
    /// 2 when the gateway could not start (configuration, bind), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            GatewayError::RedisUrl(_)
            | GatewayError::Bind(..)
            | GatewayError::Server(_)
            | GatewayError::Identity(_) => 2,
            _ => 1,
        }
    }
}

/// Wakes the thread that waits in the server's `recv` for the stop; the
/// signal handler calls [`Unblocker::unblock_all`].
#[derive(Clone, Default)]
pub struct Unblocker(Arc<Mutex<Option<Arc<Server>>>>);

impl Unblocker {
    fn set(&self, server: Arc<Server>) {
        if let Ok(mut s) = self.0.lock() {
            *s = Some(server);
        }
    }

    /// Unblocks the waiting thread (a no-op before `run` has created the
    /// server: `run` then sees the flag at start).
    pub fn unblock_all(&self) {
        if let Ok(s) = self.0.lock() {
            if let Some(server) = s.as_ref() {
                server.unblock();
            }
        }
    }
}

/// Binds `addr` with the options every accepted connection inherits from
/// the listening socket on Linux: `SO_SNDTIMEO` (`write_timeout`: a client
/// that stops reading cannot hold a handler longer), `SO_SNDBUF`
/// (`send_buffer` bytes unless 0: the kernel's autotuning), TCP
/// keep-alive (dead peers are noticed after about 90 s), `TCP_NODELAY`.
///
/// A receive timeout cannot be set this way: on the listening socket it
/// also limits `accept`, which would stop tiny_http's accept loop.
fn bind(
    addr: SocketAddr,
    write_timeout: Duration,
    send_buffer: usize,
) -> std::io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_write_timeout(Some(write_timeout))?;
    if send_buffer > 0 {
        s.set_send_buffer_size(send_buffer)?;
    }
    s.set_tcp_nodelay(true)?;
    s.set_keepalive(true)?;
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    s.set_tcp_keepalive(&ka)?;
    s.bind(&addr.into())?;
    s.listen(LISTEN_BACKLOG)?;
    Ok(s.into())
}

/// Serves the API until `shutdown` is triggered, then answers what is
/// being handled and returns.
///
/// Errors: see [`GatewayError`].
pub fn run(
    config: Config,
    shutdown: Shutdown,
    reload: Reload,
    unblocker: Unblocker,
) -> Result<(), GatewayError> {
    let client = Target::open(config.redis_url.as_str()).map_err(GatewayError::RedisUrl)?;
    let identity = Identity::from_config(&config).map_err(GatewayError::Identity)?;
    let listener = bind(
        config.listen,
        config.gateway_write_timeout,
        config.gateway_send_buffer,
    )
    .map_err(|e| GatewayError::Bind(config.listen, e))?;
    let metrics = Arc::new(Metrics::default());
    let (reserver, job_rx) = match config.gateway_redis_threads {
        0 => (Reserver::RoundTrip, None),
        _ => {
            let (jobs, rx) = crossbeam_channel::bounded(QUEUE_CAPACITY);
            (Reserver::GroupCommit { jobs }, Some(rx))
        }
    };
    let links = config.effective_gateway_threads();
    let (loader, load_requests) = buyers::loader();
    let app = Arc::new(App {
        metrics: metrics.clone(),
        soldout: SoldOutCache::new(config.gateway_buyers_max),
        buyers: loader,
        buckets: Default::default(),
        client: client.clone(),
        redis_timeout: config.redis_timeout,
        body_limit: config.body_limit_bytes,
        reserver,
        links: LinkPool::new(&client, links, config.redis_timeout, &metrics),
        active: AtomicUsize::new(0),
        closing: AtomicBool::new(false),
        redis_unfit: AtomicBool::new(false),
        identity,
        limits: Limits::new(&config),
        trusted_proxies: config.gateway_trusted_proxies.clone(),
        shed: Shed::new(config.gateway_purchases_in_flight),
        payment_secret: config.payment_secret.clone(),
        payment_tolerance_s: config.payment_tolerance.as_secs(),
    });
    if matches!(app.identity, Identity::Jwt(_)) {
        let (app, config, shutdown) = (app.clone(), config.clone(), shutdown.clone());
        std::thread::Builder::new()
            .name("gw-keys".into())
            .spawn(move || reload_keys(&app, &config, &shutdown, &reload))
            .map_err(GatewayError::Thread)?;
    }
    {
        let app = app.clone();
        std::thread::Builder::new()
            .name("gw-buyers".into())
            .spawn(move || buyers::run(app, load_requests))
            .map_err(GatewayError::Thread)?;
    }
    if let Some(rx) = job_rx {
        let ack = (config.redis_replicas_ack > 0)
            .then_some((config.redis_replicas_ack, config.redis_timeout / 2));
        for i in 0..config.gateway_redis_threads {
            let link = Link::new(client.clone(), config.redis_timeout, metrics.clone());
            let (rx, metrics) = (rx.clone(), metrics.clone());
            std::thread::Builder::new()
                .name(format!("gw-redis-{i}"))
                .spawn(move || group_commit::redis_thread(rx, link, &metrics, ack))
                .map_err(GatewayError::Thread)?;
        }
    }
    // Requests are handled on the connection threads the server starts.
    let on_request = app.clone();
    let server = Arc::new(
        Server::from_listener_with_handler(listener, Arc::new(move |rq| handle(&on_request, rq)))
            .map_err(|e| GatewayError::Server(e.to_string()))?,
    );

    unblocker.set(server.clone());
    log::info!(
        "seckill-gateway listening on {} ({} Redis links for reads, {})",
        config.listen,
        links,
        match config.gateway_redis_threads {
            0 => "one Redis round trip per purchase".to_string(),
            n => format!("group commit over {n} Redis threads"),
        }
    );
    let slots = app.limits.capacity().0.max(app.limits.capacity().1);
    log::info!(
        "limits: {}/s burst {} per buyer per sale, {}/s burst {} per client address (0: none), \
         {} entries ({} MiB) per table; trusted proxies: [{}]; at most {} purchases in flight",
        config.gateway_buyer_rate,
        config.gateway_buyer_burst,
        config.gateway_address_rate,
        config.gateway_address_burst,
        slots,
        (slots * crate::limits::ENTRY_BYTES) >> 20,
        config
            .gateway_trusted_proxies
            .ranges()
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        config.gateway_purchases_in_flight,
    );
    start_readiness(app.clone(), shutdown.clone())?;

    // Wait for the stop (the signal handler unblocks `recv`) or for the
    // accept loop's fatal error.
    let mut accept_failed = false;
    while !shutdown.is_triggered() {
        match server.recv() {
            Ok(rq) => drop(rq), // cannot happen: requests go to `handle`
            // `unblock` is only called after the trigger.
            Err(e) if !shutdown.is_triggered() => {
                log::error!("http server stopped accepting: {e}");
                accept_failed = true;
                shutdown.trigger();
            }
            Err(_) => {}
        }
    }
    // Requests that arrive from now on get 503; wait for those being
    // handled and for purchases in a Redis pipeline.
    app.closing.store(true, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + STOP_WAIT;
    while app.active.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    seckill_common::notify::stopping();
    log::info!("seckill-gateway stopped");
    if accept_failed {
        return Err(GatewayError::Accept("see the log".into()));
    }
    Ok(())
}

/// Tells systemd `READY=1` once Redis first answers `PING` (retrying with
/// the link's backoff), so `Type=notify` units order after a live gateway.
fn start_readiness(app: Arc<App>, shutdown: Shutdown) -> Result<(), GatewayError> {
    std::thread::Builder::new()
        .name("gw-readiness".into())
        .spawn(move || {
            let mut link = Link::new(app.client.clone(), app.redis_timeout, app.metrics.clone());
            while !shutdown.is_triggered() {
                if link
                    .with(|con| redis::cmd("PING").query::<redis::Value>(con))
                    .is_ok()
                {
                    seckill_common::notify::ready();
                    log::info!("redis answers; ready");
                    return;
                }
                std::thread::sleep(BACKOFF_MAX / 4);
            }
        })
        .map(|_| ())
        .map_err(GatewayError::Thread)
}

/// How often the key thread looks for a reload request.
const RELOAD_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Reads the key file again after each SIGHUP ([`Reload`]) until
/// `shutdown`; an unusable file is logged and the keys in use stay.
fn reload_keys(app: &App, config: &Config, shutdown: &Shutdown, reload: &Reload) {
    while !shutdown.is_triggered() {
        std::thread::sleep(RELOAD_POLL);
        if reload.take() {
            match app.identity.reload(config) {
                Ok(()) => log::info!("buyer-token keys reloaded"),
                Err(e) => log::error!("key reload refused, the keys in use stay: {e}"),
            }
        }
    }
}
