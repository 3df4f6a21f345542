//! Where data lives: every PATH is a local path or an object-store URL.
//!
//! A path whose text starts with `scheme://` is a URL: `s3://bucket/key`
//! (also `s3a`), `gs://bucket/key`, `az://container/key` (also `abfs`,
//! `abfss`, `adl`, `azure`), `http(s)://host/path` (read-only) or
//! `file:///path` (a local path). Everything else is a local path, handled
//! with `std::fs` exactly as before, so local reads cost what they did.
//!
//! Paths stay [`Path`]s through the library (a URL is a path whose text is
//! the URL: `Path::join` and `Path::with_file_name` work on it as on a local
//! path), and the functions here dispatch on [`locate`]. Object stores are
//! built on demand from the URL, the standard environment of each store
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and the options given to [`configure`]
//! (`--storage-option KEY=VALUE`), and driven by one shared tokio runtime.
//!
//! Secrets never travel in a URL: one with a password, a query string or a
//! fragment is refused, so a URL can be printed, logged and recorded in an
//! output's metadata as it is. Messages from the stores' clients are
//! redacted of every secret value hubnorm knows of before they are shown.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{HubnormError, Result};

#[cfg(feature = "cloud")]
mod remote;
#[cfg(not(feature = "cloud"))]
#[path = "stub.rs"]
mod remote;

#[cfg(feature = "cloud")]
pub(crate) use remote::store_for_url;
#[cfg(feature = "sql")]
pub(crate) use remote::unless_stopped;
pub use remote::{ObjectUrl, RemoteFile, RemoteRead};

/// What a path names: a local file or folder, or an object (or prefix) in an
/// object store.
#[derive(Debug)]
pub enum Location {
    Local(PathBuf),
    Remote(ObjectUrl),
}

/// Whether `text` is a URL (`scheme://...`) rather than a local path.
pub fn is_url(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether `path` is a URL of an object store (not a local path, `file://`
/// or an in-memory table's `memory://`).
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        is_url(s) && !s.starts_with("file://") && !s.starts_with(crate::source::memory::SCHEME)
    })
}

/// What `path` names. A URL that cannot be used (unknown scheme, secrets in
/// it, a build without object storage) is a usage error.
pub fn locate(path: &Path) -> Result<Location> {
    let Some(text) = path.to_str().filter(|s| is_url(s)) else {
        return Ok(Location::Local(path.to_path_buf()));
    };
    if let Some(rest) = text.strip_prefix("file://") {
        // file:///abs/path (an empty host) or file://localhost/abs/path.
        let local = rest.strip_prefix("localhost").unwrap_or(rest);
        if !local.starts_with('/') {
            return Err(HubnormError::Usage(format!(
                "{text}: a file:// URL needs an absolute path (file:///path/to/file)"
            )));
        }
        return Ok(Location::Local(PathBuf::from(local)));
    }
    Ok(Location::Remote(ObjectUrl::parse(text)?))
}

/// `path` with a `file://` URL turned into its local path (other paths as given).
pub fn local_or_url(path: &Path) -> Result<PathBuf> {
    Ok(match locate(path)? {
        Location::Local(p) => p,
        Location::Remote(_) => path.to_path_buf(),
    })
}

/// What to do when a store's `message` says its server answers a byte-range
/// request with the whole object (as `python -m http.server` does): hubnorm
/// reads a Parquet file's footer and row groups by ranges, so it cannot
/// read from such a server within its memory bound.
#[cfg(feature = "cloud")]
pub(crate) fn range_refusal_hint(message: &str) -> Option<&'static str> {
    message.contains("Range request not supported").then_some(
        " (the server ignores byte-range requests, by which Parquet files are read: serve them \
         from one that answers them, e.g. nginx, Caddy or an object store, or copy them locally)",
    )
}

/// The HTTP status with which a store's `message` says its server refused
/// to list a folder (WebDAV's `PROPFIND`, which object_store's HTTP store
/// lists with, answered "405 Method Not Allowed" or "501 Not Implemented",
/// as plain web servers answer it), or `None`.
#[cfg(feature = "cloud")]
pub(crate) fn refused_listing_status(message: &str) -> Option<&'static str> {
    if !message.contains("Error performing PROPFIND") {
        return None;
    }
    ["405 Method Not Allowed", "501 Not Implemented"]
        .into_iter()
        .find(|status| message.contains(status))
}

/// `url` with an alias scheme replaced by the one it stands for (`s3a://`
/// by `s3://`; `azure://`, `adl://`, `abfs://` and `abfss://` by `az://`,
/// as `object_store` reads them alike), so two URLs of one object compare
/// equal as text.
pub(crate) fn canonical_url_text(url: &str) -> String {
    const ALIASES: [(&str, &str); 5] = [
        ("s3a://", "s3://"),
        ("azure://", "az://"),
        ("adl://", "az://"),
        ("abfs://", "az://"),
        ("abfss://", "az://"),
    ];
    for (alias, canonical) in ALIASES {
        if let Some(rest) = url.strip_prefix(alias) {
            return format!("{canonical}{rest}");
        }
    }
    url.to_owned()
}

/// Sets the options of every object store built from now on
/// (`--storage-option KEY=VALUE`, in order; a later key wins). A key no
/// store knows is refused. Besides each store's own keys (those of
/// `object_store`'s `AmazonS3ConfigKey`, `GoogleConfigKey`,
/// `AzureConfigKey` and `ClientConfigKey`, e.g. `aws_endpoint`,
/// `aws_allow_http`, `timeout`), hubnorm reads `max_retries` and
/// `retry_timeout` (e.g. `30s`): how often and for how long a transient
/// failure is retried.
pub fn configure(options: &[(String, String)]) -> Result<()> {
    remote::configure(options)
}

/// Parses `KEY=VALUE` (the form of `--storage-option`).
pub fn parse_option(text: &str) -> Result<(String, String)> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_ascii_lowercase(), value.to_owned()))
        }
        // Nothing of it is shown: it may be a secret mistyped
        // (`aws_secret_access_key:...`, or the value alone).
        _ => Err(HubnormError::Usage(
            "--storage-option takes KEY=VALUE (e.g. aws_endpoint=http://127.0.0.1:9000); one given has no '=' (not shown: it may hold a secret)".into(),
        )),
    }
}

/// `message` with every secret hubnorm knows of (secret storage options and
/// the credential variables of the environment) replaced by `<redacted>`.
pub fn redact(message: &str) -> String {
    scrub_url_secrets(&remote::redact(message))
}

/// `text` with the user information (`user:password@`) and the query string
/// of every URL in it replaced by `<redacted>`: what a store or DataFusion
/// repeats of a URL hubnorm did not parse (an endpoint, a table name).
pub fn scrub_url_secrets(text: &str) -> String {
    let ends_token = |c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let token_end = after.find(ends_token).unwrap_or(after.len());
        let (url, tail) = after.split_at(token_end);
        // `user:password@`: the password may hold `/`, `?` or `#` typed
        // unescaped; otherwise the user information ends the authority.
        let user_end = match url.split_once('@') {
            Some((user_info, _)) if user_info.contains(':') => Some(user_info.len()),
            _ => {
                let authority = &url[..url.find(['/', '?', '#']).unwrap_or(url.len())];
                authority.rfind('@')
            }
        };
        let path = match user_end {
            Some(end) => {
                out.push_str("<redacted>");
                &url[end..]
            }
            None => url,
        };
        match path.find(['?', '#']) {
            Some(query) => {
                out.push_str(&path[..query]);
                out.push_str("?<redacted>");
            }
            None => out.push_str(path),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Whether a file or an object exists at `path` (a folder or a prefix does
/// not count).
pub fn exists(path: &Path) -> Result<bool> {
    match locate(path)? {
        Location::Local(p) => Ok(p.exists()),
        Location::Remote(url) => url.exists(),
    }
}

/// Whether `path` is a local folder, or a prefix under which an object store
/// holds at least one object.
pub fn is_dir(path: &Path) -> Result<bool> {
    match locate(path)? {
        Location::Local(p) => Ok(p.is_dir()),
        Location::Remote(url) => url.has_children(),
    }
}

/// Whether `path` is a local file or an object.
pub fn is_file(path: &Path) -> Result<bool> {
    match locate(path)? {
        Location::Local(p) => Ok(p.is_file()),
        Location::Remote(url) => url.exists(),
    }
}

/// The whole of a small text file or object (a config, a manifest, SQL).
pub fn read_to_string(path: &Path) -> Result<String> {
    match locate(path)? {
        Location::Local(p) => std::fs::read_to_string(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HubnormError::input(path, None, None, "no such file"),
            _ => HubnormError::io(path, e),
        }),
        Location::Remote(url) => url.read_to_string(),
    }
}

/// Makes the folder `path` (an object store has no folders: nothing to do).
pub fn create_dir_all(path: &Path) -> Result<()> {
    match locate(path)? {
        Location::Local(p) => create_local_dir_all(&p),
        Location::Remote(url) => url.check_writable(),
    }
}

/// Makes the local folder `dir` and those above it; a file in the way is a
/// usage error naming it (an output path names a folder there).
pub fn create_local_dir_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        let in_the_way = dir.ancestors().find(|d| d.is_file());
        match in_the_way {
            Some(file) => HubnormError::Usage(format!(
                "{} is a file, where the output needs a folder ({}); choose another --out",
                file.display(),
                dir.display()
            )),
            None => HubnormError::io(dir, e),
        }
    })
}

/// Moves a file or an object (an object store copies, then deletes).
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    match (locate(from)?, locate(to)?) {
        (Location::Local(a), Location::Local(b)) => {
            std::fs::rename(a, b).map_err(|e| HubnormError::io(to, e))
        }
        (Location::Remote(a), Location::Remote(b)) => a.rename_to(&b),
        _ => Err(HubnormError::Internal(format!(
            "cannot move {} to {} (one local, one remote)",
            from.display(),
            to.display()
        ))),
    }
}

/// Deletes a file or an object; one already gone is no error.
pub fn remove_file(path: &Path) -> Result<()> {
    match locate(path)? {
        Location::Local(p) => match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HubnormError::io(path, e)),
            _ => Ok(()),
        },
        Location::Remote(url) => url.delete(),
    }
}

/// Deletes a folder and everything in it (every object under a prefix).
pub fn remove_dir_all(path: &Path) -> Result<()> {
    match locate(path)? {
        Location::Local(p) => std::fs::remove_dir_all(&p).map_err(|e| HubnormError::io(path, e)),
        Location::Remote(url) => url.delete_prefix(),
    }
}

/// The files directly in a folder (the objects directly under a prefix),
/// as paths of the same kind as `dir`.
pub fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    match locate(dir)? {
        Location::Local(p) => {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(&p).map_err(|e| HubnormError::io(dir, e))? {
                out.push(entry.map_err(|e| HubnormError::io(dir, e))?.path());
            }
            Ok(out)
        }
        Location::Remote(url) => Ok(url
            .list_children()?
            .into_iter()
            .map(|name| dir.join(name))
            .collect()),
    }
}

/// Size, modification time and (for objects) entity tag of a file or an
/// object: what tells a changed input part from an unchanged one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub bytes: u64,
    /// Nanoseconds since the Unix epoch (0 when unknown).
    pub modified_ns: u128,
    /// The object's ETag (`None` for local files).
    pub etag: Option<String>,
}

/// The [`Identity`] of `path` as it is now (`None` when it cannot be read).
pub fn identity(path: &Path) -> Option<Identity> {
    read_identity(path).ok()
}

/// The [`Identity`] of `path` as it is now, or why it cannot be read.
pub fn read_identity(path: &Path) -> Result<Identity> {
    match locate(path)? {
        Location::Local(p) => {
            let meta = std::fs::metadata(&p).map_err(|e| HubnormError::io(&p, e))?;
            Ok(Identity {
                bytes: meta.len(),
                modified_ns: meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos()),
                etag: None,
            })
        }
        Location::Remote(url) => url.identity(),
    }
}

/// The Parquet files an object-store URL names (an object, a prefix read
/// recursively, or a glob on keys), sorted by key. See
/// [`crate::source::expand_spec`].
pub(crate) fn expand_remote(url: &ObjectUrl) -> Result<Vec<PathBuf>> {
    url.expand()
}

/// [`expand_remote`] with each object's [`Identity`], from the listing.
pub(crate) fn expand_remote_identified(url: &ObjectUrl) -> Result<Vec<(PathBuf, Identity)>> {
    url.expand_identified()
}

/// Bytes the memory plan counts per Parquet reader, whose decoded record
/// batches take `batch_bytes`, for ranged reads from an object store (the
/// read windows and their prefetches): 0 while no embedding table of an
/// object store is open in this process.
pub fn read_buffer_bytes(batch_bytes: usize) -> usize {
    if REMOTE_TABLES.load(Ordering::Relaxed) > 0 {
        remote::read_buffer_bytes_for(batch_bytes)
    } else {
        0
    }
}

/// The read window of a remote reader whose decoded batches take
/// `batch_bytes` (what [`read_buffer_bytes`] counts).
pub(crate) fn window_bytes_for(batch_bytes: usize) -> usize {
    remote::window_bytes_for(batch_bytes)
}

/// Embedding tables with parts in an object store, alive now.
static REMOTE_TABLES: AtomicUsize = AtomicUsize::new(0);

/// Held by an embedding table with parts in an object store (and its
/// clones): while one lives, memory plans count the read windows
/// ([`read_buffer_bytes`]). Plans made meanwhile for local tables in the
/// same process count them too, which only makes their blocks smaller.
#[derive(Debug)]
pub struct RemoteTable(());

impl RemoteTable {
    pub fn new() -> std::sync::Arc<RemoteTable> {
        REMOTE_TABLES.fetch_add(1, Ordering::Relaxed);
        std::sync::Arc::new(RemoteTable(()))
    }
}

impl Drop for RemoteTable {
    fn drop(&mut self) {
        REMOTE_TABLES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Blocks SIGPIPE on the calling thread (for the threads of a runtime that
/// talks to object stores). The command-line tool restores SIGPIPE's default
/// action so that `hubnorm sql ... | head` ends quietly; but a store that
/// drops a connection while a request body is written (HTTP clients write
/// with `writev`, which cannot ask for no signal) would then kill the
/// process instead of failing the request. Blocked on these threads, the
/// write fails with EPIPE and the request goes through the retries and the
/// error path like any other failure.
pub fn block_sigpipe_on_this_thread() {
    #[cfg(unix)]
    // SAFETY: the set is initialised by sigemptyset before use, and
    // pthread_sigmask only changes the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Runs `future` (object-store or Delta log requests) on the shared I/O
/// runtime and waits for it, or until a stop is requested.
#[cfg(feature = "delta")]
pub(crate) fn block_on_io<F>(future: F) -> Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    remote::block_on(future)
}

/// Uploads the finished local file `spool` to the object `url`: it appears
/// under its name only once complete (one PUT, or a multipart upload
/// completed at the end and aborted on failure or Ctrl-C).
pub(crate) fn upload(spool: &Path, url: &ObjectUrl) -> Result<()> {
    url.upload_from(spool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_from_local_paths() {
        assert!(is_url("s3://bucket/key"));
        assert!(is_url("abfss://c@a.dfs.core.windows.net/k"));
        assert!(!is_url("gallery/part-0.parquet"));
        assert!(!is_url("/data/s3:/x"));
        assert!(!is_url("C:\\data\\x.parquet"));
        assert!(!is_url("://nothing"));
        assert!(is_remote(Path::new("gs://b/k")));
        assert!(!is_remote(Path::new("file:///tmp/x")));
        assert!(!is_remote(Path::new("memory://queries-1")));
        match locate(Path::new("file:///tmp/x.parquet")).unwrap() {
            Location::Local(p) => assert_eq!(p, PathBuf::from("/tmp/x.parquet")),
            Location::Remote(u) => panic!("{u} is local"),
        }
        assert!(locate(Path::new("file://relative/x")).is_err());
    }

    #[cfg(feature = "cloud")]
    #[test]
    fn urls_with_secrets_are_refused_without_echoing_them() {
        for url in [
            "https://user:hunter2-secret@host/x.parquet",
            "https://hunter2-token@host/x.parquet",
            "s3://bucket/x.parquet?X-Amz-Signature=hunter2-secret",
            "s3://bucket/x.parquet#hunter2-secret",
        ] {
            let err = locate(Path::new(url)).unwrap_err();
            let message = err.to_string();
            assert_eq!(err.exit_code(), 2, "{message}");
            assert!(message.contains("must not carry"), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let err = locate(Path::new("ftp://host/x")).unwrap_err().to_string();
        assert!(err.contains("unsupported URL scheme"), "{err}");
    }

    #[test]
    fn secrets_of_urls_in_messages_are_cut_out() {
        let message = "table 'datafusion.public.http://u:pw-secret@h:1/g.parquet' not found; \
                       GET http://tok-secret@h/x?X-Amz-Signature=sig,secret (s3://b/k#frag-secret) \
                       http://u:p/w-secret@h/g http://u:p,w-secret@h/g \
                       s3://bucket/key.parquet, lake/gallery@12, s3://lake/g@3 and /local/path stay";
        let scrubbed = scrub_url_secrets(message);
        assert!(!scrubbed.contains("secret"), "{scrubbed}");
        assert!(scrubbed.contains("'datafusion.public.http://<redacted>@h:1/g.parquet'"));
        assert!(scrubbed.contains("GET http://<redacted>@h/x?<redacted> (s3://b/k?<redacted>"));
        assert!(scrubbed.contains("http://<redacted>@h/g http://<redacted>@h/g "));
        assert!(scrubbed.ends_with(
            "s3://bucket/key.parquet, lake/gallery@12, s3://lake/g@3 and /local/path stay"
        ));
    }

    #[test]
    fn storage_options_parse_as_key_value() {
        assert_eq!(
            parse_option("AWS_ENDPOINT=http://h:1/?a=b").unwrap(),
            ("aws_endpoint".into(), "http://h:1/?a=b".into())
        );
        assert!(parse_option("novalue").is_err());
        assert!(parse_option("=x").is_err());
    }

    #[cfg(feature = "cloud")]
    #[test]
    fn unknown_options_are_refused_and_secret_ones_redacted() {
        assert!(configure(&[("no_such_key".into(), "1".into())]).is_err());
        assert!(configure(&[("retry_timeout".into(), "soon".into())]).is_err());
        configure(&[
            ("aws_secret_access_key".into(), "hunter2-secret".into()),
            ("retry_timeout".into(), "2s".into()),
            ("aws_region".into(), "eu-west-1".into()),
        ])
        .unwrap();
        let said = redact("signing with hunter2-secret in eu-west-1");
        configure(&[]).unwrap();
        assert_eq!(said, "signing with <redacted> in eu-west-1");
    }
}
