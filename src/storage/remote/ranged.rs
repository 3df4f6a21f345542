//! Ranged reads of one object: windows fetched ahead per read stream, for
//! parquet's synchronous reader (see the parent module).

use super::*;

/// Bytes one ranged GET reads ahead (a page larger than this is read
/// whole), between these bounds: a reader of embedding tables takes half the
/// size of one decoded record batch ([`window_bytes_for`]), so the window
/// grows with the batch the memory plan sized (a few percent of the limit).
/// Each request costs a round trip whatever its size (tens of milliseconds
/// on S3), so larger windows read faster.
const MIN_WINDOW_BYTES: usize = 512 << 10;
const MAX_WINDOW_BYTES: usize = 8 << 20;
/// A reader keeps at most this many windows (one per place it reads: the
/// id, embedding and target columns at most).
const READ_STREAMS: usize = 3;
/// Windows fetched ahead of each stream's current one, concurrently: one
/// request at a time would read at one window per round trip, well below
/// what a store serves (a local S3 server: about 45 MB/s with one, so a
/// 150 MB gallery chunk kept the cores idle for seconds).
const PREFETCH_DEPTH: usize = 4;
/// Bytes read from the end of an object at open: the footer usually fits,
/// so opening costs one request.
const TAIL_BYTES: u64 = 64 << 10;

/// The read window of a reader whose decoded record batches take
/// `batch_bytes`.
pub(crate) fn window_bytes_for(batch_bytes: usize) -> usize {
    (batch_bytes / 2).clamp(MIN_WINDOW_BYTES, MAX_WINDOW_BYTES)
}

/// What the memory plan counts per remote Parquet reader whose decoded
/// batches take `batch_bytes`: per stream its window, the windows fetched
/// ahead, and the previous window while the decoder still holds a page of
/// it (pages are slices of a window, not copies); and the tail read at open.
pub(crate) fn read_buffer_bytes_for(batch_bytes: usize) -> usize {
    READ_STREAMS * (2 + PREFETCH_DEPTH) * window_bytes_for(batch_bytes) + TAIL_BYTES as usize
}

/// An object read by ranges, for the parquet crate's synchronous reader
/// (its [`parquet::file::reader::ChunkReader`]): page headers and pages are
/// served from windows of 512 KiB to 8 MiB fetched by ranged GETs, the next
/// few windows fetched while the current one is decoded. The
/// reader reads one column chunk page by page, so only the windows of the
/// columns it reads are held: memory stays bounded whatever the row-group
/// size (a whole-row-group fetch would not be).
#[derive(Debug, Clone)]
pub struct RemoteFile {
    inner: Arc<RemoteInner>,
}

#[derive(Debug)]
struct RemoteInner {
    store: Arc<dyn ObjectStore>,
    key: Key,
    shown: String,
    size: u64,
    state: Mutex<Windows>,
    /// Bytes per window ([`window_bytes_for`]).
    window: std::sync::atomic::AtomicUsize,
    /// The first failed request, for the block reader's message.
    failure: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
struct Windows {
    /// Byte ranges of the column chunks (windows stop at their ends).
    chunks: Arc<Vec<Range<u64>>>,
    streams: Vec<Window>,
    clock: u64,
}

#[derive(Debug)]
struct Window {
    start: u64,
    data: Bytes,
    /// The next windows, being fetched in order: each one's range and request.
    prefetch: VecDeque<(
        Range<u64>,
        tokio::task::JoinHandle<object_store::Result<Bytes>>,
    )>,
    used: u64,
}

impl Window {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        for (_, task) in self.prefetch.drain(..) {
            task.abort();
        }
    }
}

impl RemoteFile {
    /// Opens the object at `url` (one HEAD and one ranged GET of its tail).
    pub(crate) fn open(url: &ObjectUrl) -> Result<RemoteFile> {
        let store = url.store()?;
        let key = url.key.clone();
        let meta = {
            let (store, key) = (store.clone(), key.clone());
            block_on(async move { store.head(&key).await })?.map_err(|e| url.error("HEAD", e))?
        };
        let file = RemoteFile {
            inner: Arc::new(RemoteInner {
                store,
                key,
                shown: url.to_string(),
                size: meta.size,
                state: Mutex::new(Windows::default()),
                window: std::sync::atomic::AtomicUsize::new(MIN_WINDOW_BYTES),
                failure: Mutex::new(None),
            }),
        };
        if meta.size > 0 {
            let start = meta.size.saturating_sub(TAIL_BYTES);
            let data = file
                .fetch(start..meta.size)
                .map_err(|message| HubnormError::Storage {
                    url: url.to_string(),
                    // A server without byte ranges is refused on the first
                    // read, as a usage problem (the hint says what to do).
                    exit_code: if crate::storage::range_refusal_hint(&message).is_some() {
                        2
                    } else {
                        1
                    },
                    message,
                })?;
            let mut state = file.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            state.streams.push(Window {
                start,
                data,
                prefetch: VecDeque::new(),
                used: 0,
            });
        }
        Ok(file)
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Tells the reader where the column chunks lie, so that windows stop
    /// at a chunk's end instead of reading into the next one.
    ///
    /// Adjacent chunks are merged into one run: the columns of a row group
    /// are read together, so one window serves all of them (one request
    /// where a window per chunk would make one per column and row group).
    pub(crate) fn set_chunks(&self, mut chunks: Vec<Range<u64>>) {
        chunks.sort_by_key(|r| r.start);
        let mut runs: Vec<Range<u64>> = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            match runs.last_mut() {
                Some(run) if chunk.start <= run.end => run.end = run.end.max(chunk.end),
                _ => runs.push(chunk),
            }
        }
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        state.chunks = Arc::new(runs);
    }

    /// Reads in windows of `bytes` (within the 512 KiB to 8 MiB bounds of
    /// every window) from now on.
    pub fn set_window_bytes(&self, bytes: usize) {
        self.inner.window.store(
            bytes.clamp(MIN_WINDOW_BYTES, MAX_WINDOW_BYTES),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The failure of a request this file made, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.inner
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn fetch(&self, range: Range<u64>) -> std::result::Result<Bytes, String> {
        let (store, key) = (self.inner.store.clone(), self.inner.key.clone());
        let shown = self.inner.shown.clone();
        let what = format!("GET bytes {}..{}", range.start, range.end);
        let result = block_on(async move { store.get_range(&key, range).await })
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| failure_text(storage_error(&shown, &what, e))));
        if let Err(message) = &result {
            let mut failure = self.inner.failure.lock().unwrap_or_else(|e| e.into_inner());
            failure.get_or_insert_with(|| message.clone());
        }
        result
    }

    /// Where a window starting at `start` ends: a window's length on, but
    /// not past the end of its column chunk or of the object.
    fn window_end(&self, chunks: &[Range<u64>], start: u64, at_least: u64) -> u64 {
        let chunk_end = run_holding(chunks, start).map_or(self.inner.size, |c| c.end);
        let window = self.inner.window.load(std::sync::atomic::Ordering::Relaxed);
        (start + window as u64)
            .min(chunk_end)
            .max(at_least)
            .min(self.inner.size)
    }

    /// At least one and at most `max` bytes from `offset` on (fewer at a
    /// window's end).
    fn read_some(&self, offset: u64, max: usize) -> std::result::Result<Bytes, String> {
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        state.clock += 1;
        let clock = state.clock;
        let chunks = state.chunks.clone();
        // A window holding `offset`, or one whose prefetch starts there.
        let found = state.streams.iter().position(|w| {
            (w.start <= offset && offset < w.end())
                || w.prefetch.front().is_some_and(|(r, _)| r.start == offset)
        });
        let index = match found {
            Some(i) => {
                let window = &mut state.streams[i];
                if offset >= window.end() {
                    let (range, task) = window.prefetch.pop_front().expect("matched on it");
                    let data = block_on(task)
                        .and_then(|joined| {
                            joined.map_err(|e| {
                                HubnormError::Internal(format!("object-store request failed: {e}"))
                            })
                        })
                        .map_err(|e| e.to_string())
                        .and_then(|r| {
                            r.map_err(|e| failure_text(storage_error(&self.inner.shown, "GET", e)))
                        });
                    let data = match data {
                        Ok(data) => data,
                        Err(message) => {
                            let mut failure =
                                self.inner.failure.lock().unwrap_or_else(|e| e.into_inner());
                            failure.get_or_insert_with(|| message.clone());
                            return Err(message);
                        }
                    };
                    window.start = range.start;
                    window.data = data;
                    self.prefetch_after(&chunks, window);
                }
                i
            }
            None => {
                let end = self.window_end(&chunks, offset, offset + max as u64);
                drop(state);
                let data = self.fetch(offset..end)?;
                let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
                if state.streams.len() >= READ_STREAMS {
                    // The least recently used stream makes room.
                    let oldest = (0..state.streams.len())
                        .min_by_key(|&i| state.streams[i].used)
                        .expect("not empty");
                    state.streams.swap_remove(oldest);
                }
                let mut window = Window {
                    start: offset,
                    data,
                    prefetch: VecDeque::new(),
                    used: clock,
                };
                self.prefetch_after(&chunks, &mut window);
                state.streams.push(window);
                let i = state.streams.len() - 1;
                let window = &state.streams[i];
                let from = (offset - window.start) as usize;
                let take = max.min(window.data.len() - from);
                return Ok(window.data.slice(from..from + take));
            }
        };
        let window = &mut state.streams[index];
        window.used = clock;
        let from = (offset - window.start) as usize;
        let take = max.min(window.data.len() - from);
        Ok(window.data.slice(from..from + take))
    }

    /// Tops up the windows being fetched after `window` to
    /// [`PREFETCH_DEPTH`], within its run of column chunks.
    fn prefetch_after(&self, chunks: &[Range<u64>], window: &mut Window) {
        while window.prefetch.len() < PREFETCH_DEPTH {
            let start = window.prefetch.back().map_or(window.end(), |(r, _)| r.end);
            let in_chunk = run_holding(chunks, start).is_some_and(|c| c.start < start);
            if start >= self.inner.size || !in_chunk {
                return;
            }
            let end = self.window_end(chunks, start, start);
            let (store, key) = (self.inner.store.clone(), self.inner.key.clone());
            let task = runtime().spawn(async move { store.get_range(&key, start..end).await });
            window.prefetch.push_back((start..end, task));
        }
    }

    /// `length` bytes from `start` on.
    fn read_exact_at(&self, start: u64, length: usize) -> std::result::Result<Bytes, String> {
        if start + length as u64 > self.inner.size {
            return Err(format!(
                "{}: read of {length} bytes at {start} past the end ({} bytes)",
                self.inner.shown, self.inner.size
            ));
        }
        let first = self.read_some(start, length)?;
        if first.len() == length {
            return Ok(first);
        }
        let mut out = Vec::with_capacity(length);
        out.extend_from_slice(&first);
        while out.len() < length {
            let piece = self.read_some(start + out.len() as u64, length - out.len())?;
            if piece.is_empty() {
                return Err(format!("{}: short read", self.inner.shown));
            }
            out.extend_from_slice(&piece);
        }
        Ok(Bytes::from(out))
    }
}

/// The run of `runs` (sorted, disjoint) that holds `offset`.
fn run_holding(runs: &[Range<u64>], offset: u64) -> Option<&Range<u64>> {
    let i = runs.partition_point(|r| r.end <= offset);
    runs.get(i).filter(|r| r.start <= offset)
}

fn parquet_error(message: String) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(std::io::Error::other(message)))
}

impl parquet::file::reader::Length for RemoteFile {
    fn len(&self) -> u64 {
        self.inner.size
    }
}

impl parquet::file::reader::ChunkReader for RemoteFile {
    type T = RemoteRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<RemoteRead> {
        Ok(RemoteRead {
            file: self.clone(),
            position: start,
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.read_exact_at(start, length).map_err(parquet_error)
    }
}

/// A [`Read`] over a [`RemoteFile`] from an offset on (page headers).
pub struct RemoteRead {
    file: RemoteFile,
    position: u64,
}

impl Read for RemoteRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() || self.position >= self.file.inner.size {
            return Ok(0);
        }
        let piece = self
            .file
            .read_some(self.position, buf.len())
            .map_err(std::io::Error::other)?;
        buf[..piece.len()].copy_from_slice(&piece);
        self.position += piece.len() as u64;
        Ok(piece.len())
    }
}
