//! Specifies `Request::respond_now` of the vendored tiny_http (patch 0015),
//! on a real server and real sockets: an answer is written whole when the
//! socket takes it, and is never waited for when it does not (the client
//! stopped reading, or an earlier answer of the connection is not written
//! yet): the rest comes back as `Unfinished`, whose `finish` writes it in
//! order. The gateway's Redis threads answer purchases this way
//! (gateway/src/http/answer.rs), so a thread serving many connections is never
//! held up by one of them.

use socket2::{Domain, Socket, Type};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiny_http::{Request, Response, Server, Unfinished};

/// A guard against a hang, not a timed assertion: a wait this long fails
/// the test.
const HANG: Duration = Duration::from_secs(30);

/// What the handler did with one request: its path, and the rest of its
/// answer if `respond_now` left one.
type Done = (String, Option<Unfinished>);

/// A server whose handler answers `GET /big` with `big` bytes and any
/// other path with its own path as the body, by `respond_now`, and reports
/// each outcome.
fn server(big: usize) -> (SocketAddr, mpsc::Receiver<Done>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel::<Done>();
    let tx = Arc::new(Mutex::new(tx));
    let server = Server::from_listener_with_handler(
        listener,
        Arc::new(move |rq: Request| {
            let path = rq.url().to_string();
            let body = if path == "/big" {
                pattern(big)
            } else {
                path.clone().into_bytes()
            };
            let rest = rq
                // Content-Length, never chunked, whatever the size.
                .respond_now(Response::from_data(body).with_chunked_threshold(usize::MAX))
                .expect("respond_now");
            tx.lock().unwrap().send((path, rest)).unwrap();
        }),
    )
    .unwrap();
    // Lives as long as the test process (its threads are detached).
    std::mem::forget(server);
    (addr, rx)
}

/// `n` bytes of a known pattern.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A client whose receive buffer is as small as the kernel allows, so the
/// server's answers fill the socket quickly while it does not read.
fn small_client(addr: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(2048).unwrap();
    s.connect(&addr.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(HANG)).unwrap();
    s
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
}

/// Reads one answer: its status and its body (by `Content-Length`).
fn read_answer(r: &mut impl BufRead) -> (u16, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("Content-Length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, body)
}

#[test]
fn an_answer_the_socket_takes_is_written_whole_at_once() {
    let (addr, done) = server(0);
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(HANG)).unwrap();
    c.write_all(get("/one").as_bytes()).unwrap();
    let (path, rest) = done.recv_timeout(HANG).expect("the handler answers");
    assert_eq!(path, "/one");
    assert!(
        rest.is_none(),
        "a small answer to a reading client is whole"
    );
    let mut r = BufReader::new(c);
    assert_eq!(read_answer(&mut r), (200, b"/one".to_vec()));
    // The connection serves its next request as usual.
    r.get_mut().write_all(get("/two").as_bytes()).unwrap();
    let (path, rest) = done.recv_timeout(HANG).expect("the handler answers");
    assert_eq!((path.as_str(), rest.is_none()), ("/two", true));
    assert_eq!(read_answer(&mut r), (200, b"/two".to_vec()));
}

#[test]
fn an_answer_that_would_wait_is_left_unfinished_and_finished_in_order() {
    const BIG: usize = 16 << 20;
    let (addr, done) = server(BIG);
    let mut c = small_client(addr);
    // The client sends two requests and reads nothing yet.
    c.write_all(get("/big").as_bytes()).unwrap();
    let (path, big) = done.recv_timeout(HANG).expect("respond_now never waits");
    assert_eq!(path, "/big");
    let big = big.expect("16 MiB do not fit in the socket of a client that does not read");
    c.write_all(get("/after").as_bytes()).unwrap();
    let (path, after) = done
        .recv_timeout(HANG)
        .expect("respond_now never waits for an earlier answer");
    assert_eq!(path, "/after");
    let after = after.expect("an earlier answer is not written yet: nothing is");

    // Finished out of order on purpose: the later answer waits for the
    // earlier one, never the other way round.
    let second = std::thread::spawn(move || after.finish());
    std::thread::sleep(Duration::from_millis(50));
    let first = std::thread::spawn(move || big.finish());
    let mut r = BufReader::new(c);
    let (status, body) = read_answer(&mut r);
    assert_eq!(status, 200);
    assert_eq!(body.len(), BIG);
    assert!(
        body == pattern(BIG),
        "the big answer arrives whole and intact"
    );
    assert_eq!(read_answer(&mut r), (200, b"/after".to_vec()));
    first.join().unwrap().expect("finish");
    second.join().unwrap().expect("finish");

    // And the connection goes on.
    r.get_mut().write_all(get("/third").as_bytes()).unwrap();
    let (path, rest) = done.recv_timeout(HANG).expect("the handler answers");
    assert_eq!((path.as_str(), rest.is_none()), ("/third", true));
    assert_eq!(read_answer(&mut r), (200, b"/third".to_vec()));
}

#[test]
fn an_abandoned_answer_closes_its_connection_and_serves_nothing_after() {
    const BIG: usize = 16 << 20;
    let (addr, done) = server(BIG);
    let mut c = small_client(addr);
    c.write_all(get("/big").as_bytes()).unwrap();
    let (_, big) = done.recv_timeout(HANG).expect("respond_now never waits");
    big.expect("left unfinished").abandon();
    c.write_all(get("/next").as_bytes()).ok();
    // The client reads what was written, then the end of the stream.
    let mut all = Vec::new();
    let _ = c.read_to_end(&mut all);
    assert!(
        all.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        &all[..all.len().min(40)]
    );
    assert!(all.len() < BIG, "the answer was cut short");
    assert!(
        done.recv_timeout(Duration::from_millis(500)).is_err(),
        "no request is read after an abandoned answer"
    );
}
