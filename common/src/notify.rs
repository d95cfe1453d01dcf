//! Owns systemd readiness notification (`sd_notify`): `READY=1` once the
//! service's dependencies answer, `STOPPING=1` on shutdown, for units of
//! `Type=notify`. Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `"READY=1"`) to `$NOTIFY_SOCKET`. Returns whether a
/// message was sent; failures are logged, never fatal.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let sock = match UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => {
            log::warn!("sd_notify: socket: {e}");
            return false;
        }
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // Abstract socket namespace (Linux).
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|addr| sock.send_to_addr(state.as_bytes(), &addr))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    match sent {
        Ok(_) => true,
        Err(e) => {
            log::warn!("sd_notify {state:?}: {e}");
            false
        }
    }
}

/// Tells systemd the service is ready (`READY=1`).
pub fn ready() -> bool {
    notify("READY=1")
}

/// Tells systemd the service is stopping (`STOPPING=1`).
pub fn stopping() -> bool {
    notify("STOPPING=1")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_reaches_a_notify_socket() {
        let dir = std::env::temp_dir().join(format!("seckill-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let server = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // Safe here: this test is the only one in the crate touching the variable.
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(super::ready());
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!super::stopping());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
