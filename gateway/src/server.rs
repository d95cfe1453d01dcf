//! Owns the process: the settings resolved into each layer's part, the
//! threads beside the server's (group-commit Redis threads, the buyers
//! loader, the Redis fitness check, readiness, key reloads), and the
//! orderly stop on SIGTERM (requests being handled and purchases in a
//! pipeline answered, exit 0). The only place that sees every layer.

use crate::admission::identity::{Identity, IdentityError};
use crate::admission::limits::{Limits, ENTRY_BYTES};
use crate::admission::shed::Shed;
use crate::admission::Admission;
use crate::config::{IdentitySettings, Settings};
use crate::http::listener::{self, ListenError, Unblocker};
use crate::http::{Gateway, Lifecycle};
use crate::metrics::Metrics;
use crate::payments::Payments;
use crate::purchase::buyers;
use crate::purchase::soldout::SoldOutCache;
use crate::purchase::Purchases;
use crate::queries::Reads;
use crate::redis::fitness::Fitness;
use crate::redis::group_commit::{self, Job, QUEUE_CAPACITY};
use crate::redis::link::{LinkPool, BACKOFF_MAX};
use crate::redis::reserver::{Mode, Reserver};
use crate::redis::Redis;
use crossbeam_channel::Receiver;
use seckill_common::redis_target::Target;
use seckill_common::shutdown::Reload;
use seckill_common::Shutdown;
use seckill_common::{redact, redis_error};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Longest wait at stop for requests being handled and purchases still in
/// a Redis pipeline.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// Why the gateway could not run. [`GatewayError::exit_code`] maps each to
/// the documented exit code (2: cannot start, 1: failed while running).
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// `SECKILL_REDIS_URL` is not a usable Redis URL.
    RedisUrl(redis::RedisError),
    /// The listen address cannot be bound, or the HTTP server refused it.
    Listen(ListenError),
    /// A thread could not be started.
    Thread(std::io::Error),
    /// The accept loop stopped (e.g. out of file descriptors).
    Accept(String),
    /// The identity settings cannot be used (no key file with `jwt`...).
    Identity(IdentityError),
    /// Redis refused the password of `SECKILL_REDIS_URL` at start: the
    /// address (password hidden), the client's error and the remedy.
    RedisRefused(String),
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayError::RedisUrl(e) => write!(
                f,
                "SECKILL_REDIS_URL: {e}: expected a URL such as redis://127.0.0.1:6379/"
            ),
            GatewayError::Listen(e) => write!(f, "{e}"),
            GatewayError::Thread(e) => write!(f, "starting a thread: {e}"),
            GatewayError::Accept(e) => write!(f, "accepting connections: {e}"),
            GatewayError::Identity(e) => write!(f, "{e}"),
            GatewayError::RedisRefused(d) => write!(f, "redis at {d}"),
        }
    }
}

impl std::error::Error for GatewayError {}

impl GatewayError {
    /// 2 when the gateway could not start (configuration, bind, a Redis
    /// that refuses the password), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            GatewayError::RedisUrl(_)
            | GatewayError::Listen(_)
            | GatewayError::Identity(_)
            | GatewayError::RedisRefused(_) => 2,
            _ => 1,
        }
    }
}

/// Starts a named thread.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), GatewayError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(GatewayError::Thread)
}

/// Serves the API until `shutdown` is triggered, then answers what is
/// being handled and returns.
///
/// Errors: see [`GatewayError`].
pub fn run(
    s: Settings,
    shutdown: Shutdown,
    reload: Reload,
    unblocker: Unblocker,
) -> Result<(), GatewayError> {
    let client = Target::open(&s.redis_url).map_err(GatewayError::RedisUrl)?;
    refuse_wrong_password(&client, &s)?;
    let identity = Identity::from_config(&s.identity).map_err(GatewayError::Identity)?;
    let bound = listener::bind_to(&s.listen).map_err(GatewayError::Listen)?;
    let bound_at = bound.local_addr().unwrap_or(s.listen.addr);
    let metrics = Arc::new(Metrics::default());
    let redis = Redis {
        client,
        timeout: s.redis_timeout,
        metrics: metrics.clone(),
    };
    let (gw, jobs, load_requests) = build(&s, identity, &redis);
    let gw = Arc::new(gw);
    start_threads(&s, &gw, &redis, jobs, load_requests, &shutdown, reload)?;
    let server = bound
        .serve(gw.clone(), &unblocker)
        .map_err(GatewayError::Listen)?;
    log_start(&s, bound_at, &gw.admission.limits);
    start_readiness(redis, shutdown.clone())?;

    let accept_failed = server.serve_until(&shutdown);
    gw.lifecycle.drain(STOP_WAIT);
    seckill_common::notify::stopping();
    log::info!("seckill-gateway stopped");
    if accept_failed {
        return Err(GatewayError::Accept("see the log".into()));
    }
    Ok(())
}

/// Asks Redis once at start for a `PING`: a refused password stops the
/// gateway (waiting does not fix it); anything else (Redis down, slow) is
/// left to the links, which reconnect, and to `/readyz`.
///
/// Errors: [`GatewayError::RedisRefused`] naming the address (without its
/// password) and the remedy.
fn refuse_wrong_password(client: &Target, s: &Settings) -> Result<(), GatewayError> {
    let pinged = client
        .connect(s.redis_timeout)
        .and_then(|mut con| ::redis::cmd("PING").query::<()>(&mut con));
    match pinged {
        Err(e) if redis_error::is_auth(&e) => Err(GatewayError::RedisRefused(format!(
            "{}: {}",
            redact::address(&s.redis_url, "SECKILL_REDIS_URL"),
            redis_error::explain(&e)
        ))),
        _ => Ok(()),
    }
}

/// Each layer's part, built from the settings; the group commit's queue
/// and the buyers loader's requests for their threads.
fn build(
    s: &Settings,
    identity: Identity,
    redis: &Redis,
) -> (Gateway, Option<Receiver<Job>>, Receiver<(u64, u64)>) {
    let metrics = redis.metrics.clone();
    let (mode, job_rx) = match s.redis_threads {
        0 => (Mode::RoundTrip, None),
        _ => {
            let (jobs, rx) = crossbeam_channel::bounded(QUEUE_CAPACITY);
            (Mode::GroupCommit { jobs }, Some(rx))
        }
    };
    let links = Arc::new(LinkPool::new(
        &redis.client,
        s.links,
        s.redis_timeout,
        &metrics,
    ));
    let buckets = Arc::new(Default::default());
    let (loader, load_requests) = buyers::loader();
    let purchases = Purchases {
        soldout: Arc::new(SoldOutCache::new(s.buyers_max)),
        paused: Default::default(),
        buckets: Arc::clone(&buckets),
        buyers: loader,
        reserver: Reserver::new(mode, links.clone(), s.redis_timeout, metrics.clone()),
        links: links.clone(),
        fitness: Arc::new(Fitness::default()),
        metrics: metrics.clone(),
    };
    let gw = Gateway {
        purchases,
        admission: Admission {
            identity,
            limits: Limits::new(&s.limits),
            shed: Shed::new(s.purchases_in_flight),
            metrics: metrics.clone(),
        },
        reads: Reads {
            links: links.clone(),
            buckets: Arc::clone(&buckets),
        },
        payments: Payments {
            settings: s.payments.clone(),
            links,
            buckets,
        },
        metrics,
        trusted_proxies: s.trusted_proxies.clone(),
        body_limit: s.body_limit,
        redis_timeout: s.redis_timeout,
        lifecycle: Lifecycle::default(),
    };
    (gw, job_rx, load_requests)
}

/// The threads beside the server's: key reloads (with tokens), the
/// buyers loader, the Redis fitness check, the group commit's Redis
/// threads.
fn start_threads(
    s: &Settings,
    gw: &Arc<Gateway>,
    redis: &Redis,
    jobs: Option<Receiver<Job>>,
    load_requests: Receiver<(u64, u64)>,
    shutdown: &Shutdown,
    reload: Reload,
) -> Result<(), GatewayError> {
    if matches!(gw.admission.identity, Identity::Jwt(_)) {
        let (gw, settings, shutdown) = (gw.clone(), s.identity.clone(), shutdown.clone());
        spawn("gw-keys", move || {
            reload_keys(&gw.admission.identity, &settings, &shutdown, &reload)
        })?;
    }
    let (soldout, link, metrics) = (
        gw.purchases.soldout.clone(),
        redis.link(),
        redis.metrics.clone(),
    );
    spawn("gw-buyers", move || {
        buyers::run(&soldout, link, &metrics, load_requests)
    })?;
    let (fitness, r, stop) = (
        gw.purchases.fitness.clone(),
        redis.clone(),
        shutdown.clone(),
    );
    spawn("gw-redis-check", move || fitness.run(&r, &stop))?;
    if let Some(rx) = jobs {
        let ack = (s.replicas_ack > 0).then_some((s.replicas_ack, s.redis_timeout / 2));
        for i in 0..s.redis_threads {
            let (rx, link, metrics) = (rx.clone(), redis.link(), redis.metrics.clone());
            spawn(&format!("gw-redis-{i}"), move || {
                group_commit::redis_thread(rx, link, &metrics, ack)
            })?;
        }
    }
    Ok(())
}

/// The start's log lines: the links, the Redis mode and the limits, and a
/// warning while payments are not configured.
fn log_start(s: &Settings, bound_at: std::net::SocketAddr, limits: &Limits) {
    log::info!(
        "seckill-gateway listening on {bound_at} ({} Redis links for reads, {})",
        s.links,
        match s.redis_threads {
            0 => "one Redis round trip per purchase".to_string(),
            n => format!("group commit over {n} Redis threads"),
        }
    );
    let slots = limits.capacity().0.max(limits.capacity().1);
    log::info!(
        "limits: {}/s burst {} per buyer per sale, {}/s burst {} per client address (0: none), \
         {} entries ({} MiB) per table; trusted proxies: [{}]; at most {} purchases in flight",
        s.limits.buyer_rate,
        s.limits.buyer_burst,
        s.limits.address_rate,
        s.limits.address_burst,
        slots,
        (slots * ENTRY_BYTES) >> 20,
        s.trusted_proxies
            .ranges()
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        s.purchases_in_flight,
    );
    if s.payments.secret.is_none() {
        log::warn!(
            "SECKILL_PAYMENT_SECRET is not set: POST /v1/payments answers 503 \
             payments_not_configured; set it (at least 16 bytes, shared with the payment \
             service) in the env file, /etc/seckill/seckill.env for the installed units"
        );
    }
}

/// Tells systemd `READY=1` once Redis first answers `PING` (retrying with
/// the link's backoff), so `Type=notify` units order after a live gateway.
fn start_readiness(redis: Redis, shutdown: Shutdown) -> Result<(), GatewayError> {
    spawn("gw-readiness", move || {
        let mut link = redis.link();
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
}

/// How often the key thread looks for a reload request.
const RELOAD_POLL: Duration = Duration::from_millis(100);

/// Reads the key file again after each SIGHUP ([`Reload`]) until
/// `shutdown`; an unusable file is logged and the keys in use stay.
fn reload_keys(
    identity: &Identity,
    settings: &IdentitySettings,
    shutdown: &Shutdown,
    reload: &Reload,
) {
    while !shutdown.is_triggered() {
        std::thread::sleep(RELOAD_POLL);
        if reload.take() {
            match identity.reload(settings) {
                Ok(()) => log::info!("buyer-token keys reloaded"),
                Err(e) => log::error!("key reload refused, the keys in use stay: {e}"),
            }
        }
    }
}
