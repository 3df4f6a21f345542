//! Object stores: the URL type, the registry that builds stores on demand,
//! the shared runtime, ranged Parquet reads and uploads.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutPayload, RetryConfig};
use url::Url;

use crate::error::{HubnormError, Result};

mod ranged;

pub(crate) use ranged::{read_buffer_bytes_for, window_bytes_for};
pub use ranged::{RemoteFile, RemoteRead};

// ------------------------------------------------------------------ URLs

/// An object, or a prefix of objects, in an object store. Holds no secret
/// (URLs with a password, a query or a fragment are refused), so it is
/// shown, logged and recorded as it is.
#[derive(Debug, Clone)]
pub struct ObjectUrl {
    url: Url,
    scheme: ObjectStoreScheme,
    key: Key,
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.url.as_str())
    }
}

/// The text of a URL that did not parse, with what may be secret cut out
/// by its place: the user information before `@` and the query string.
fn without_credentials(text: &str) -> String {
    let (text, query) = match text.split_once('?') {
        Some((before, _)) => (before, "?<redacted>"),
        None => (text, ""),
    };
    let Some((scheme, rest)) = text.split_once("://") else {
        return format!("{text}{query}");
    };
    // `user:password@`: the password may hold a `/` typed unescaped.
    if let Some((user_info, after)) = rest.split_once('@') {
        if user_info.contains(':') {
            return format!("{scheme}://<redacted>@{after}{query}");
        }
    }
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://<redacted>@{host}{path}{query}"),
        None => format!("{text}{query}"),
    }
}

impl ObjectUrl {
    /// Parses an object-store URL (see [`super`] for the schemes).
    pub fn parse(text: &str) -> Result<ObjectUrl> {
        let url = Url::parse(text).map_err(|e| {
            HubnormError::Usage(format!(
                "{}: not a valid URL ({e})",
                super::redact(&without_credentials(text))
            ))
        })?;
        let user = !url.username().is_empty();
        if user || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
            let mut shown = url.clone();
            let _ = shown.set_password(None);
            let _ = shown.set_username("");
            shown.set_query(None);
            shown.set_fragment(None);
            // In an object-store key a `?` was meant as a glob.
            let glob_hint = if url.query().is_some() && !url.scheme().starts_with("http") {
                "; `?` starts a query string: match one character of a key with `[...]`"
            } else {
                ""
            };
            return Err(HubnormError::Usage(format!(
                "{shown}: a URL must not carry a user, a password, a query string or a fragment (credentials go in the environment, e.g. AWS_ACCESS_KEY_ID, or in --storage-option KEY=VALUE){glob_hint}"
            )));
        }
        let (scheme, key) = ObjectStoreScheme::parse(&url).map_err(|_| {
            HubnormError::Usage(format!(
                "{url}: unsupported URL scheme '{}' (s3://, gs://, az://, abfss://, http(s):// or file:// are read and written)",
                url.scheme()
            ))
        })?;
        if matches!(scheme, ObjectStoreScheme::Memory | ObjectStoreScheme::Local) {
            return Err(HubnormError::Usage(format!(
                "{url}: unsupported URL scheme '{}'",
                url.scheme()
            )));
        }
        Ok(ObjectUrl { url, scheme, key })
    }

    /// `scheme://authority`: which store holds the object.
    fn base(&self) -> &str {
        &self.url[..url::Position::BeforePath]
    }

    /// The URL of `key` in the same store. Each part of the key is
    /// percent-encoded, so a key holding `%`, a space or `?` (Spark writes
    /// `ts=2026-01-01 00%3A00%3A00/`) parses back to the same key.
    fn url_of(&self, key: &Key) -> String {
        let mut url = self.url.clone();
        // https://s3.region.amazonaws.com/bucket/key and the like: the bucket
        // or container is the first segment of the path; for s3://bucket/key,
        // gs://, az://... the key follows the authority, and an HTTP store's
        // keys are whole URL paths.
        let bucket =
            (self.url.scheme() == "https" && self.scheme != ObjectStoreScheme::Http).then(|| {
                let path = self.url.path().trim_start_matches('/');
                path.split('/').next().unwrap_or_default().to_owned()
            });
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.clear();
            segments.extend(bucket.as_deref());
            segments.extend(key.parts().map(|part| part.as_ref().to_owned()));
        }
        url.into()
    }

    fn read_only(&self) -> bool {
        self.scheme == ObjectStoreScheme::Http
    }

    /// Whether the URL ends in `/` (names a prefix, not an object).
    fn names_prefix(&self) -> bool {
        self.url.path().ends_with('/')
    }

    fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        store_for(self)
    }

    /// A store failure on this URL as a hubnorm error.
    fn error(&self, what: &str, e: object_store::Error) -> HubnormError {
        storage_error(&self.to_string(), what, e)
    }

    /// Refuses writing to a read-only store.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only() {
            return Err(HubnormError::Usage(format!(
                "{self}: http(s):// URLs are read-only; write outputs to a local path or to s3://, gs:// or az://"
            )));
        }
        Ok(())
    }

    /// Refuses an output that names no object: a bucket alone
    /// (`s3://bucket`, whose objects a file or table cannot replace).
    pub(crate) fn check_names_object(&self) -> Result<()> {
        if self.key.as_ref().is_empty() {
            return Err(HubnormError::Usage(format!(
                "{self}: an output file needs a key that names an object, e.g. {}/results.parquet",
                self.url.as_str().trim_end_matches('/')
            )));
        }
        Ok(())
    }

    /// Whether an object exists under this exact key.
    pub(crate) fn exists(&self) -> Result<bool> {
        Ok(self.size()?.is_some())
    }

    /// The size of the object under this exact key, if there is one.
    fn size(&self) -> Result<Option<u64>> {
        Ok(self.head()?.map(|meta| meta.size))
    }

    /// The object's metadata; `None` when the URL names a prefix or no object.
    fn head(&self) -> Result<Option<object_store::ObjectMeta>> {
        if self.names_prefix() || self.key.as_ref().is_empty() {
            return Ok(None);
        }
        let store = self.store()?;
        let key = self.key.clone();
        match block_on(async move { store.head(&key).await })? {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("HEAD", e)),
        }
    }

    /// Whether at least one object lies under this prefix.
    pub(crate) fn has_children(&self) -> Result<bool> {
        let store = self.store()?;
        let key = self.key.clone();
        let first = block_on(async move {
            let mut listing = store.list(Some(&key));
            listing.try_next().await
        })?;
        match first {
            Ok(first) => Ok(first.is_some()),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error("LIST", e)),
        }
    }

    /// The whole object as UTF-8 text.
    pub(crate) fn read_to_string(&self) -> Result<String> {
        let store = self.store()?;
        let key = self.key.clone();
        let bytes = block_on(async move { store.get(&key).await?.bytes().await })?
            .map_err(|e| self.error("GET", e))?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| HubnormError::input(self.to_string(), None, None, "not UTF-8 text"))
    }

    pub(crate) fn rename_to(&self, to: &ObjectUrl) -> Result<()> {
        self.check_writable()?;
        if self.base() != to.base() {
            return Err(HubnormError::Internal(format!(
                "cannot move {self} to {to}: another store"
            )));
        }
        let store = self.store()?;
        let (from, dest) = (self.key.clone(), to.key.clone());
        block_on(async move { store.rename(&from, &dest).await })?
            .map_err(|e| to.error("rename", e))
    }

    pub(crate) fn delete(&self) -> Result<()> {
        self.check_writable()?;
        let store = self.store()?;
        let key = self.key.clone();
        match block_on(async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("DELETE", e)),
        }
    }

    /// Every object under this prefix, with its metadata, sorted by key.
    fn list_all(&self) -> Result<Vec<object_store::ObjectMeta>> {
        let store = self.store()?;
        let key = self.key.clone();
        let mut objects: Vec<object_store::ObjectMeta> =
            block_on(async move { store.list(Some(&key)).try_collect().await })?
                .map_err(|e| self.error("LIST", e))?;
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(objects)
    }

    pub(crate) fn delete_prefix(&self) -> Result<()> {
        for object in self.list_all()? {
            let url = ObjectUrl::parse(&self.url_of(&object.location))?;
            url.delete()?;
        }
        Ok(())
    }

    /// Names of the objects directly under this prefix.
    pub(crate) fn list_children(&self) -> Result<Vec<String>> {
        let store = self.store()?;
        let key = self.key.clone();
        let listing = block_on(async move { store.list_with_delimiter(Some(&key)).await })?
            .map_err(|e| self.error("LIST", e))?;
        let mut names: Vec<String> = listing
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    pub(crate) fn identity(&self) -> Result<super::Identity> {
        let store = self.store()?;
        let key = self.key.clone();
        let meta =
            block_on(async move { store.head(&key).await })?.map_err(|e| self.error("HEAD", e))?;
        Ok(identity_of(&meta))
    }

    /// The Parquet objects this URL names: the object itself; every
    /// `.parquet`/`.parq` object under the prefix (recursively, skipping
    /// names that start with `_` or `.`); or the objects whose keys match a
    /// glob (`*` and `?` within one `/`-separated level, `**` across).
    pub(crate) fn expand(&self) -> Result<Vec<PathBuf>> {
        Ok(self
            .expand_identified()?
            .into_iter()
            .map(|(path, _)| path)
            .collect())
    }

    /// [`ObjectUrl::expand`] with each object's identity, from the
    /// listing (no request per object).
    pub(crate) fn expand_identified(&self) -> Result<Vec<(PathBuf, super::Identity)>> {
        let key = self.key.as_ref();
        if let Some(first) = key.find(['*', '?', '[']) {
            return self.expand_glob(first);
        }
        if let Some(meta) = self.head()? {
            crate::source::refuse_empty_file(Path::new(&self.to_string()), meta.size)?;
            return Ok(vec![(PathBuf::from(self.to_string()), identity_of(&meta))]);
        }
        let objects = self.list_all().map_err(|e| match e {
            HubnormError::Input { .. } => HubnormError::input(
                self.to_string(),
                None,
                None,
                "no such object, prefix or bucket",
            ),
            // No such object (HEAD), and no folder of that name the server
            // will list (a plain HTTP server lists none): the user's to fix.
            HubnormError::Storage {
                exit_code: 2,
                message,
                ..
            } if !self.names_prefix() && !key.is_empty() => HubnormError::input(
                self.to_string(),
                None,
                None,
                format!("no such object (nor a folder to list: {message})"),
            ),
            other => other,
        })?;
        if objects.is_empty() {
            return Err(HubnormError::input(
                self.to_string(),
                None,
                None,
                "no such object or prefix",
            ));
        }
        let depth = self.key.parts_count();
        let chosen: Vec<&object_store::ObjectMeta> = objects
            .iter()
            .filter(|o| {
                let parts: Vec<_> = o.location.parts().skip(depth).collect();
                let name = parts.last().map_or("", |p| p.as_ref());
                parts.iter().all(|p| !p.as_ref().starts_with(['.', '_']))
                    && (name.ends_with(".parquet") || name.ends_with(".parq"))
            })
            .collect();
        let files = self.checked_files(&self.key, &objects, &chosen)?;
        if files.is_empty() {
            return Err(HubnormError::input(
                self.to_string(),
                None,
                None,
                "prefix holds no .parquet objects",
            ));
        }
        Ok(files)
    }

    fn expand_glob(&self, first_wildcard: usize) -> Result<Vec<(PathBuf, super::Identity)>> {
        let key = self.key.as_ref();
        // The key is percent-decoded by object_store; the pattern is the
        // decoded key, matched against decoded keys.
        let pattern = glob::Pattern::new(key)
            .map_err(|e| HubnormError::Usage(format!("bad glob '{self}': {e}")))?;
        let literal = &key[..first_wildcard];
        // The key's parts before the one with the wildcard, as they are
        // (`Key::from` would encode a `%` of theirs again).
        let prefix = Key::from_iter(self.key.parts().take(literal.matches('/').count()));
        let lister = ObjectUrl {
            key: prefix,
            ..self.clone()
        };
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let below_literal = &key[literal.rfind('/').map_or(0, |slash| slash + 1)..];
        let objects = lister.list_all()?;
        let chosen: Vec<&object_store::ObjectMeta> = objects
            .iter()
            .filter(|o| {
                let below = o.location.prefix_match(&lister.key).into_iter().flatten();
                pattern.matches_with(o.location.as_ref(), options)
                    && !crate::source::is_unasked_hidden(below_literal, below)
            })
            .collect();
        let files = self.checked_files(&lister.key, &objects, &chosen)?;
        if files.is_empty() {
            return Err(HubnormError::input(
                self.to_string(),
                None,
                None,
                format!(
                    "no object matches this glob{}",
                    crate::source::SKIPPED_HIDDEN
                ),
            ));
        }
        Ok(files)
    }

    /// The URLs of `chosen`, objects of the listing of `listed` (all of
    /// whose `objects` are given), refusing any of 0 bytes, and refusing
    /// them all when one lies in a Delta table: a table whose log is among
    /// `objects`, or one whose folder holds `listed`.
    fn checked_files(
        &self,
        listed: &Key,
        objects: &[object_store::ObjectMeta],
        chosen: &[&object_store::ObjectMeta],
    ) -> Result<Vec<(PathBuf, super::Identity)>> {
        use crate::source::DELTA_LOG_DIR;
        if !chosen.is_empty() {
            let mut tables: Vec<Key> = objects
                .iter()
                .filter_map(|o| {
                    let parts: Vec<_> = o.location.parts().collect();
                    let log = parts.iter().position(|p| p.as_ref() == DELTA_LOG_DIR)?;
                    Some(Key::from_iter(parts[..log].iter().cloned()))
                })
                .collect();
            tables.dedup();
            let folders: Vec<_> = listed.parts().collect();
            for depth in 0..folders.len() {
                let folder = Key::from_iter(folders[..depth].iter().cloned());
                let log = ObjectUrl {
                    key: folder.clone().join(DELTA_LOG_DIR),
                    ..self.clone()
                };
                // A folder this user may not list (a bucket shared by
                // prefix: access denied) holds no table of theirs; any
                // other failure is one.
                match log.has_children() {
                    Ok(true) => tables.push(folder),
                    Ok(false) => {}
                    Err(HubnormError::Storage { exit_code: 2, .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            for table in &tables {
                if chosen.iter().any(|o| o.location.prefix_matches(table)) {
                    return Err(crate::source::refuse_files_of_delta_table(
                        &self.to_string(),
                        &self.url_of(table),
                    ));
                }
            }
        }
        chosen
            .iter()
            .map(|o| {
                let url = PathBuf::from(self.url_of(&o.location));
                crate::source::refuse_empty_file(&url, o.size)?;
                Ok((url, identity_of(o)))
            })
            .collect()
    }

    /// Uploads the local file `spool` to this object, all or nothing.
    pub(crate) fn upload_from(&self, spool: &Path) -> Result<()> {
        self.check_writable()?;
        let store = self.store()?;
        let key = self.key.clone();
        let spool_path = spool.to_path_buf();
        let shown = self.to_string();
        block_on_to_end(async move { upload(store, key, spool_path, shown).await })?
    }
}

fn identity_of(meta: &object_store::ObjectMeta) -> super::Identity {
    super::Identity {
        bytes: meta.size,
        modified_ns: meta
            .last_modified
            .timestamp_nanos_opt()
            .map_or(0, |n| n.max(0) as u128),
        etag: meta.e_tag.clone(),
    }
}

/// Parts of a multipart upload (S3 needs at least 5 MiB but for the last),
/// and how many are in flight at once: the upload holds at most
/// `(UPLOAD_CONCURRENCY + 1) × UPLOAD_PART_BYTES`. Smaller files go in one PUT.
const UPLOAD_PART_BYTES: usize = 8 << 20;
const UPLOAD_CONCURRENCY: usize = 2;
/// How long a failed or stopped upload waits for its abort to be answered.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn upload(
    store: Arc<dyn ObjectStore>,
    key: Key,
    spool: PathBuf,
    shown: String,
) -> Result<()> {
    let failed = |what: &str, e: object_store::Error| storage_error(&shown, what, e);
    let io = |e: std::io::Error| HubnormError::io(&spool, e);
    let mut file = std::fs::File::open(&spool).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size <= UPLOAD_PART_BYTES as u64 {
        let mut data = Vec::with_capacity(size as usize);
        file.read_to_end(&mut data).map_err(io)?;
        unless_stopped(store.put(&key, PutPayload::from(data)))
            .await?
            .map_err(|e| failed("PUT", e))?;
        return Ok(());
    }
    let mut upload = store
        .put_multipart(&key)
        .await
        .map_err(|e| failed("multipart upload", e))?;
    // Parts are sent by hand rather than through `WriteMultipart`, whose
    // `finish` sends the last part and cannot be stopped halfway.
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let outcome: Result<()> = async {
        loop {
            crate::cancel::check_requests()?;
            let mut part = vec![0u8; UPLOAD_PART_BYTES];
            let n = read_full(&mut file, &mut part).map_err(io)?;
            if n == 0 {
                break;
            }
            part.truncate(n);
            while in_flight.len() >= UPLOAD_CONCURRENCY {
                wait_for_a_part(&mut in_flight, &failed).await?;
            }
            in_flight.push(upload.put_part(PutPayload::from(part)));
        }
        while !in_flight.is_empty() {
            wait_for_a_part(&mut in_flight, &failed).await?;
        }
        unless_stopped(upload.complete())
            .await?
            .map_err(|e| failed("multipart upload", e))?;
        Ok(())
    }
    .await;
    if outcome.is_err() {
        // Nothing may stay behind: no object, no orphaned parts. A server
        // that does not answer keeps them (only its lifecycle rules can
        // remove them), but not the user waiting.
        drop(in_flight);
        let _ = tokio::time::timeout(ABORT_WAIT, upload.abort()).await;
    }
    outcome
}

/// Waits, stoppably, for one of the parts in flight to be stored.
async fn wait_for_a_part(
    in_flight: &mut futures::stream::FuturesUnordered<object_store::UploadPart>,
    failed: &impl Fn(&str, object_store::Error) -> HubnormError,
) -> Result<()> {
    use futures::StreamExt;
    match unless_stopped(in_flight.next()).await? {
        Some(Err(e)) => Err(failed("multipart upload", e)),
        Some(Ok(())) | None => Ok(()),
    }
}

/// Reads until `buffer` is full or the file ends.
fn read_full(file: &mut std::fs::File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

// ------------------------------------------------------- errors, secrets

/// A store's error on `url` as a hubnorm error: a missing object or bucket
/// and refused credentials are the user's to fix (exit code 2), the rest
/// are failures (1). Messages are redacted.
pub(crate) fn storage_error(url: &str, what: &str, e: object_store::Error) -> HubnormError {
    use object_store::Error as E;
    let message = super::redact(&e.to_string());
    // Listing a missing bucket is not a `NotFound` to object_store (S3
    // answers 404 NoSuchBucket to a LIST as to a GET, Azure 404
    // ContainerNotFound).
    let missing_bucket = message.contains("NoSuchBucket") || message.contains("ContainerNotFound");
    // Nor is a refused LIST a `PermissionDenied`: a generic error with S3's
    // status and code in its text.
    let denied = message.contains("403 Forbidden") || message.contains("AccessDenied");
    // reqwest refuses an http:// endpoint unless it is allowed, in words
    // that do not say so.
    if message.contains("builder error") {
        return HubnormError::Storage {
            url: url.to_owned(),
            message: format!(
                "{what} failed: {message} (an http:// endpoint needs --storage-option \
                 aws_allow_http=true, or AWS_ALLOW_HTTP=true)"
            ),
            exit_code: 2,
        };
    }
    if let Some(status) = super::refused_listing_status(&message) {
        // The server's error page is left out: it says no more than this.
        return HubnormError::Storage {
            url: url.to_owned(),
            message: format!(
                "{what} failed: the HTTP server does not list folders (it answers WebDAV's \
                 PROPFIND with {status}); name the files (http://HOST/DIR/FILE.parquet), or \
                 serve the folder from a WebDAV server or an object store"
            ),
            exit_code: 2,
        };
    }
    if let Some(hint) = super::range_refusal_hint(&message) {
        return HubnormError::Storage {
            url: url.to_owned(),
            message: format!("{what} failed: {message}{hint}"),
            exit_code: 2,
        };
    }
    match e {
        E::NotFound { .. } => HubnormError::input(url, None, None, "no such object or bucket"),
        _ if missing_bucket => HubnormError::input(url, None, None, "no such bucket"),
        _ if denied || matches!(e, E::PermissionDenied { .. } | E::Unauthenticated { .. }) => {
            HubnormError::Storage {
                url: url.to_owned(),
                message: format!(
                    "{what} refused: access denied ({message}); check the credentials"
                ),
                exit_code: 2,
            }
        }
        E::UnknownConfigurationKey { .. } => HubnormError::Usage(format!("{url}: {message}")),
        _ => HubnormError::Storage {
            url: url.to_owned(),
            message: format!("{what} failed: {message}"),
            exit_code: 1,
        },
    }
}

/// What went wrong, without the "error on URL" framing (the reader's
/// caller names the URL).
fn failure_text(e: HubnormError) -> String {
    match e {
        HubnormError::Storage { message, .. } | HubnormError::Input { message, .. } => message,
        other => other.to_string(),
    }
}

/// Environment variables whose values are secrets.
const SECRET_VARIABLES: [&str; 8] = [
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
];

/// Whether a storage option's value is a secret, by its key.
fn is_secret_key(key: &str) -> bool {
    [
        "secret",
        "token",
        "password",
        "sas",
        "account_key",
        "access_key",
        "service_account_key",
    ]
    .iter()
    .any(|s| key.contains(s))
        && !key.ends_with("_file")
        && !key.ends_with("_path")
}

/// `message` with the values of the secrets hubnorm knows replaced; the
/// crate's [`super::redact`] also cuts credentials out of URLs.
pub(crate) fn redact(message: &str) -> String {
    let settings = settings().read().unwrap_or_else(|e| e.into_inner());
    let env = SECRET_VARIABLES
        .iter()
        .filter_map(|v| std::env::var(v).ok());
    let mut out = message.to_owned();
    for secret in settings.secrets.iter().cloned().chain(env) {
        // Short values would redact ordinary words.
        if secret.len() >= 4 {
            out = out.replace(&secret, "<redacted>");
        }
    }
    out
}

// ------------------------------------------------------ registry, runtime

struct Settings {
    options: Vec<(String, String)>,
    retry: RetryConfig,
    secrets: Vec<String>,
}

fn settings() -> &'static RwLock<Settings> {
    static SETTINGS: OnceLock<RwLock<Settings>> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        RwLock::new(Settings {
            options: Vec::new(),
            retry: RetryConfig::default(),
            secrets: Vec::new(),
        })
    })
}

/// The stores built so far, by `scheme://authority`.
fn stores() -> &'static Mutex<HashMap<String, Arc<dyn ObjectStore>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// Whether `key` configures some store.
fn known_key(key: &str) -> bool {
    key.parse::<object_store::aws::AmazonS3ConfigKey>().is_ok()
        || key.parse::<object_store::gcp::GoogleConfigKey>().is_ok()
        || key.parse::<object_store::azure::AzureConfigKey>().is_ok()
        || key.parse::<object_store::ClientConfigKey>().is_ok()
}

pub(crate) fn configure(options: &[(String, String)]) -> Result<()> {
    let mut retry = RetryConfig::default();
    let mut kept = Vec::new();
    let mut secrets = Vec::new();
    for (key, value) in options {
        let key = key.to_ascii_lowercase();
        if is_secret_key(&key) {
            secrets.push(value.clone());
        }
        match key.as_str() {
            "max_retries" => {
                retry.max_retries = value.parse().map_err(|_| {
                    HubnormError::Usage(format!(
                        "--storage-option max_retries={value}: expected a count"
                    ))
                })?
            }
            "retry_timeout" => {
                retry.retry_timeout = parse_duration(value).ok_or_else(|| {
                    HubnormError::Usage(format!(
                        "--storage-option retry_timeout={value}: expected a duration such as 30s or 2m"
                    ))
                })?
            }
            _ if known_key(&key) => kept.push((key, value.clone())),
            _ => {
                return Err(HubnormError::Usage(format!(
                    "--storage-option {key}: no object store knows this key (see object_store's AmazonS3ConfigKey, GoogleConfigKey, AzureConfigKey and ClientConfigKey, or max_retries, retry_timeout)"
                )))
            }
        }
    }
    let mut settings = settings().write().unwrap_or_else(|e| e.into_inner());
    *settings = Settings {
        options: kept,
        retry,
        secrets,
    };
    // Stores built with the old options are dropped.
    stores().lock().unwrap_or_else(|e| e.into_inner()).clear();
    Ok(())
}

fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    humantime::parse_duration(text).ok()
}

/// The store holding `url`'s objects, built on first use.
fn store_for(url: &ObjectUrl) -> Result<Arc<dyn ObjectStore>> {
    store_for_base(url.base(), &url.url, &url.scheme)
}

/// The store of `url` (any URL of the store) for the SQL session's registry.
pub(crate) fn store_for_url(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let (scheme, _) =
        ObjectStoreScheme::parse(url).map_err(|e| HubnormError::Usage(format!("{url}: {e}")))?;
    store_for_base(&url[..url::Position::BeforePath], url, &scheme)
}

fn store_for_base(
    base: &str,
    url: &Url,
    scheme: &ObjectStoreScheme,
) -> Result<Arc<dyn ObjectStore>> {
    let mut stores = stores().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(store) = stores.get(base) {
        return Ok(store.clone());
    }
    let settings = settings().read().unwrap_or_else(|e| e.into_inner());
    let options = &settings.options;
    // The cloud builders share one sequence (options, then retries) on
    // different types: each option a builder's config key type does not
    // parse is not its own (options were checked against every store).
    macro_rules! configured {
        ($builder:expr) => {{
            let mut builder = $builder;
            for (k, v) in options {
                if let Ok(key) = k.parse() {
                    builder = builder.with_config(key, v);
                }
            }
            builder
                .with_retry(settings.retry.clone())
                .build()
                .map(|s| Arc::new(s) as _)
        }};
    }
    let built: object_store::Result<Arc<dyn ObjectStore>> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            configured!(object_store::aws::AmazonS3Builder::from_env().with_url(url.as_str()))
        }
        ObjectStoreScheme::GoogleCloudStorage => configured!(
            object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url.as_str())
        ),
        ObjectStoreScheme::MicrosoftAzure => configured!(
            object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url.as_str())
        ),
        ObjectStoreScheme::Http => {
            let mut builder = object_store::http::HttpBuilder::new().with_url(base);
            // The URL itself says plain HTTP.
            if url.scheme() == "http" {
                builder = builder.with_config(object_store::ClientConfigKey::AllowHttp, "true");
            }
            for (k, v) in options {
                if let Ok(key) = k.parse() {
                    builder = builder.with_config(key, v);
                }
            }
            builder
                .with_retry(settings.retry.clone())
                .build()
                .map(|s| Arc::new(s) as _)
        }
        other => {
            return Err(HubnormError::Usage(format!(
                "{url}: no object store for {other:?}"
            )))
        }
    };
    let store = built.map_err(|e| {
        HubnormError::Usage(format!(
            "{base}: cannot set up the object store: {}",
            super::redact(&e.to_string())
        ))
    })?;
    stores.insert(base.to_owned(), store.clone());
    Ok(store)
}

/// The runtime that drives every object-store request: a small pool of its
/// own, apart from the passes' rayon workers and any SQL runtime.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hubnorm-io")
            .on_thread_start(super::block_sigpipe_on_this_thread)
            .enable_all()
            .build()
            .expect("cannot start the object-store runtime")
    })
}

/// Runs `future` on the shared runtime and waits for it, or until a stop is
/// requested (Ctrl-C): a request stalled on a slow or lost server must not
/// hold the run, so the future is then dropped, which cancels its request.
/// Usable from any thread, a tokio worker included (the future runs on the
/// shared runtime's threads; the caller only waits).
pub(super) fn block_on<F>(future: F) -> Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    block_on_to_end(unless_stopped(future))?
}

/// [`block_on`] for work that must not be dropped halfway (an upload, which
/// aborts its parts itself when stopped).
fn block_on_to_end<F>(future: F) -> Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = runtime().spawn(crate::cancel::in_this_job(future));
    futures::executor::block_on(handle)
        .map_err(|e| HubnormError::Internal(format!("object-store request failed: {e}")))
}

/// How often a wait on the network looks for a requested stop.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// `future`'s output, or `Err(Interrupted)` once a stop is requested while
/// it is still pending. Runs on a tokio runtime (it needs its timer).
pub(crate) async fn unless_stopped<F: Future>(future: F) -> Result<F::Output> {
    tokio::pin!(future);
    let mut poll = tokio::time::interval(STOP_POLL);
    loop {
        tokio::select! {
            output = &mut future => return Ok(output),
            _ = poll.tick() => crate::cancel::check_requests()?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_key_parses_back_from_its_url() {
        let keys = [
            "hive/ts=2026-01-01 00%3A00%3A00/part-00000.parquet",
            "emb/part-?.parquet",
            "a/b#c/100%.parquet",
            "plain/part-0.parquet",
        ];
        for base in [
            "s3://lake/emb/",
            "gs://lake/x",
            "https://s3.eu-west-1.amazonaws.com/lake/emb/",
        ] {
            let prefix = ObjectUrl::parse(base).unwrap();
            for key in keys {
                let key = Key::parse(key).unwrap();
                let url = prefix.url_of(&key);
                let back = ObjectUrl::parse(&url).unwrap();
                assert_eq!(back.key, key, "{base} {url}");
                assert_eq!(back.base(), prefix.base(), "{url}");
            }
        }
    }
}
