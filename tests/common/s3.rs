//! A real S3-compatible server for the object-storage tests: `moto_server`
//! (moto 5, from PyPI) started on a free port of 127.0.0.1, ended by its
//! process id when dropped.
//!
//! moto rather than an S3 server in Rust: it speaks the S3 protocol as
//! Amazon's own SDK tests expect it (multipart uploads and their listing,
//! ranged GETs, ETags, 403s once its IAM checks are on), installs with pip
//! in seconds, and adds no crate to the build. The binary is found through
//! `HUBNORM_MOTO_SERVER`, then `.venv-s3/bin/moto_server` in the checkout
//! (what `.ci/run` creates), then `PATH`. Without it the tests print a
//! loud note and pass, unless `HUBNORM_REQUIRE_S3=1` (set by `.ci/run`),
//! which makes a missing server a failure.
//!
//! The test side talks to the server with plain HTTP/1.1 (see
//! [`TEST_AUTHORIZATION`]), so what a test checks (objects present, bytes, pending
//! multipart uploads) does not go through the code under test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The credentials the tests hand hubnorm (moto accepts any unless its IAM
/// checks are on).
pub const ACCESS_KEY: &str = "AKIAHUBNORMTEST0000";
/// Distinctive, so a test can look for it in every output and message.
pub const SECRET_KEY: &str = "hubnorm-secret-s3cr3t-value-7f3a9c";

/// What the test side sends as its credentials: moto (its IAM checks off)
/// reads the access key to know the account, and checks no signature, so
/// the test sees the objects hubnorm writes without signing requests itself.
const TEST_AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=AKIAHUBNORMTEST0000/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

/// A running moto server.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

/// Where the moto server binary is, if anywhere.
fn find_moto() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HUBNORM_MOTO_SERVER") {
        return Some(PathBuf::from(path));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-s3/bin/moto_server");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("moto_server"))
            .find(|p| p.is_file())
    })
}

/// A free TCP port on 127.0.0.1 (bound, then released for the server).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl S3Server {
    /// Starts a server, or returns `None` (after a loud note) when moto is
    /// not installed and not required.
    pub fn start_or_skip(test: &str) -> Option<S3Server> {
        Self::start_with(test, &[])
    }

    /// Starts a server whose IAM checks are on from the first request: every
    /// request with unknown credentials gets a 403.
    pub fn start_refusing(test: &str) -> Option<S3Server> {
        Self::start_with(test, &[("INITIAL_NO_AUTH_ACTION_COUNT", "0")])
    }

    fn start_with(test: &str, env: &[(&str, &str)]) -> Option<S3Server> {
        let Some(moto) = find_moto() else {
            let required = std::env::var("HUBNORM_REQUIRE_S3").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "HUBNORM_REQUIRE_S3=1 but no moto_server (set HUBNORM_MOTO_SERVER, or run .ci/run, which installs it into .venv-s3)"
            );
            eprintln!(
                "\n*** {test}: SKIPPED, no S3 server: moto_server is not installed. Install it with\n***   python3 -m venv .venv-s3 && .venv-s3/bin/pip install 'moto[server]>=5,<6'\n"
            );
            return None;
        };
        for _ in 0..5 {
            let port = free_port();
            let mut command = Command::new(&moto);
            command
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in env {
                command.env(k, v);
            }
            let child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", moto.display()));
            let mut server = S3Server { child, port };
            if server.wait_ready(Duration::from_secs(60)) {
                return Some(server);
            }
            // Lost the port to another process, or slow to start: retry.
        }
        panic!("{test}: moto_server did not start");
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok((status, _)) = self.request("GET", "/moto-api/", &[]) {
                if status > 0 {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a hubnorm process needs to reach this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// One unsigned HTTP/1.1 request; the status and the body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            TEST_AUTHORIZATION,
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no HTTP header"))?;
        let header = String::from_utf8_lossy(&response[..end]).into_owned();
        let status = header
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut body = response[end + 4..].to_vec();
        if header
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        Ok((status, body))
    }

    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.request("PUT", &format!("/{bucket}"), &[]).unwrap();
        assert!(
            status == 200,
            "create bucket {bucket}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Uploads a local file to `bucket/key` (any key: spaces and `%` too).
    pub fn put_file(&self, bucket: &str, key: &str, file: &Path) {
        let data = std::fs::read(file).unwrap();
        let (status, body) = self
            .request("PUT", &format!("/{bucket}/{}", in_path(key)), &data)
            .unwrap();
        assert!(
            status == 200,
            "put {key}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Uploads every file under `dir` to `bucket/prefix/<relative path>`.
    pub fn put_dir(&self, bucket: &str, prefix: &str, dir: &Path) {
        for entry in super::files_under(dir) {
            let relative = entry
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            self.put_file(bucket, &format!("{prefix}/{relative}"), &entry);
        }
    }

    /// The object's bytes, or `None` when there is none.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let (status, body) = self
            .request("GET", &format!("/{bucket}/{}", in_path(key)), &[])
            .unwrap();
        match status {
            200 => Some(body),
            404 => None,
            other => panic!(
                "GET {bucket}/{key}: {other} {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// Downloads an object to a local file (panics when it is missing).
    pub fn get_file(&self, bucket: &str, key: &str, to: &Path) {
        let data = self.get(bucket, key).unwrap_or_else(|| {
            panic!(
                "no object {bucket}/{key}; the bucket has {:?}",
                self.keys(bucket)
            )
        });
        std::fs::write(to, data).unwrap();
    }

    /// Every key in the bucket, sorted.
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        let (status, body) = self
            .request("GET", &format!("/{bucket}?list-type=2"), &[])
            .unwrap();
        assert_eq!(status, 200, "list {bucket}");
        let mut keys = tag_values(&String::from_utf8_lossy(&body), "Key");
        keys.sort();
        keys
    }

    /// Keys of the multipart uploads started and neither completed nor aborted.
    pub fn pending_uploads(&self, bucket: &str) -> Vec<String> {
        let (status, body) = self
            .request("GET", &format!("/{bucket}?uploads"), &[])
            .unwrap();
        assert_eq!(status, 200, "list uploads of {bucket}");
        tag_values(&String::from_utf8_lossy(&body), "Key")
    }

    /// Stops the server now (a lost store), as `Drop` would.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The texts of every `<tag>...</tag>` in `xml`.
fn tag_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split_once(&close).map(|(v, _)| v.to_owned()))
        .collect()
}

/// A chunked transfer-encoded body, decoded.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..line_end])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
}

/// A TCP proxy in front of a server that can lose it on cue: once `cut`,
/// every open connection is closed and new ones are refused, as when the
/// server goes away, while the server itself (and what it stored) stays
/// there for the test to inspect.
pub struct CutProxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Bytes sent to the server (requests) and received from it (responses).
    up: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    down: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CutProxy {
    /// A proxy to `target` on 127.0.0.1 that cuts itself once more than
    /// `cut_after_up` bytes went to the server or `cut_after_down` came back.
    pub fn start(target: u16, cut_after_up: usize, cut_after_down: usize) -> CutProxy {
        CutProxy::start_with(target, cut_after_up, cut_after_down, false)
    }

    /// A proxy to `target` on which the connection that carries the
    /// `stall_after_up`-th byte to the server stalls: what the client sends
    /// on it from then on is swallowed (the request never completes), while
    /// other connections pass. [`CutProxy::was_cut`] says when it stalled.
    pub fn stalling(target: u16, stall_after_up: usize) -> CutProxy {
        CutProxy::start_with(target, stall_after_up, usize::MAX, true)
    }

    fn start_with(
        target: u16,
        cut_after_up: usize,
        cut_after_down: usize,
        stall: bool,
    ) -> CutProxy {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let up = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicUsize::new(0));
        let proxy = CutProxy {
            port,
            cut: cut.clone(),
            up: up.clone(),
            down: down.clone(),
        };
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cut.load(Ordering::SeqCst) && !stall {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (from, to, counter, limit) in [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        up.clone(),
                        cut_after_up,
                    ),
                    (server, client, down.clone(), cut_after_down),
                ] {
                    let cut = cut.clone();
                    std::thread::spawn(move || pump(from, to, &cut, &counter, limit, stall));
                }
            }
        });
        // Pumps poll the flag; a cut is seen within this.
        fn pump(
            mut from: TcpStream,
            mut to: TcpStream,
            cut: &AtomicBool,
            counter: &AtomicUsize,
            limit: usize,
            stall: bool,
        ) {
            from.set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut buffer = vec![0u8; 64 << 10];
            let mut stalled = false;
            loop {
                if cut.load(Ordering::SeqCst) && !stall {
                    break;
                }
                match from.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(_) if stalled => {}
                    Ok(n) => {
                        if counter.fetch_add(n, Ordering::SeqCst) + n > limit {
                            let first = !cut.swap(true, Ordering::SeqCst);
                            if !stall {
                                break;
                            }
                            if first {
                                stalled = true;
                                continue;
                            }
                        }
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
            let _ = from.shutdown(std::net::Shutdown::Both);
            let _ = to.shutdown(std::net::Shutdown::Both);
        }
        proxy
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether the proxy has cut the server off.
    pub fn was_cut(&self) -> bool {
        self.cut.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Bytes sent to the server and received from it so far.
    pub fn traffic(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (
            self.up.load(Ordering::SeqCst),
            self.down.load(Ordering::SeqCst),
        )
    }
}

/// A minimal static HTTP server for `dir` on a free port of 127.0.0.1:
/// HEAD and GET, with `Range: bytes=a-b` answered by 206 (what a
/// read-only `http(s)://` input needs). Serves until the process ends.
pub fn serve_http(dir: &Path) -> u16 {
    serve_files(dir, true)
}

/// [`serve_http`], but answering every GET with the whole file, as servers
/// without byte-range support do (`python -m http.server`).
pub fn serve_http_ignoring_ranges(dir: &Path) -> u16 {
    serve_files(dir, false)
}

fn serve_files(dir: &Path, ranges: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let _ = answer(stream, &dir, ranges);
            });
        }
    });
    fn answer(mut stream: TcpStream, dir: &Path, ranges: bool) -> std::io::Result<()> {
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte)? == 0 {
                return Ok(());
            }
            request.push(byte[0]);
        }
        let request = String::from_utf8_lossy(&request).into_owned();
        let mut words = request.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
        // A plain web server: no WebDAV, so no folder listings.
        if !matches!(method, "GET" | "HEAD") {
            return stream.write_all(
                b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
        let file = dir.join(path.trim_start_matches('/'));
        let Ok(data) = std::fs::read(&file) else {
            return stream.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        };
        let range = request.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            let value = value.trim().strip_prefix("bytes=")?;
            let (a, b) = value.split_once('-')?;
            (ranges && name.eq_ignore_ascii_case("range")).then(|| {
                let a: usize = a.parse().unwrap_or(0);
                let b: usize = b
                    .parse()
                    .map_or(data.len() - 1, |b: usize| b.min(data.len() - 1));
                (a, b)
            })
        });
        let (status, body, extra) = match range {
            Some((a, b)) => (
                "206 Partial Content",
                &data[a..=b],
                format!("Content-Range: bytes {a}-{b}/{}\r\n", data.len()),
            ),
            None => ("200 OK", &data[..], String::new()),
        };
        let accepts = if ranges {
            "Accept-Ranges: bytes\r\n"
        } else {
            ""
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}{accepts}Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        if method != "HEAD" {
            stream.write_all(body)?;
        }
        Ok(())
    }
    port
}

/// `key` as a request path: the characters of keys the tests use that a
/// path cannot carry as they are, percent-encoded.
fn in_path(key: &str) -> String {
    key.replace('%', "%25").replace(' ', "%20")
}
