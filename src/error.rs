//! One error type for the library. Each variant says who is to blame, which
//! decides the exit code of the command-line tool (see [`HubnormError::exit_code`]).

use std::path::PathBuf;

/// Where in an input table a problem was found: file, 0-based row within that
/// file, and column name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    /// 0-based row index within `file`, when the problem is about one row.
    pub row: Option<u64>,
    pub column: Option<String>,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(row) = self.row {
            write!(f, ", row {row}")?;
        }
        if let Some(column) = &self.column {
            write!(f, ", column '{column}'")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in hubnorm.
#[derive(Debug, thiserror::Error)]
pub enum HubnormError {
    /// The user's data is wrong: a bad value, a missing column, a ragged embedding.
    #[error("bad input at {location}: {message}")]
    Input { location: Location, message: String },

    /// The inputs disagree with each other or with the options (dimensions, ids, methods).
    #[error("invalid usage: {0}")]
    Usage(String),

    /// The work cannot be done inside the memory limit the user gave.
    #[error("memory limit too small: {0}")]
    Budget(String),

    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A Parquet file could not be read or written.
    #[error("Parquet error on {path}: {source}")]
    Parquet {
        path: PathBuf,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// An object store refused or failed a request (after its retries).
    /// `url` names the object (never with credentials); `exit_code` is 2
    /// when the user can fix it (access denied), 1 otherwise.
    #[error("object storage error on {url}: {message}")]
    Storage {
        url: String,
        message: String,
        exit_code: i32,
    },

    /// An Arrow operation failed (a bug or an unsupported layout).
    #[error("Arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),

    /// The work was stopped before it finished (Ctrl-C, or a SQL consumer
    /// that stopped reading); nothing was committed.
    #[error("interrupted: {0}")]
    Interrupted(String),

    /// A SQL statement failed to plan or run (DataFusion's message).
    #[error("SQL: {message}")]
    Sql { message: String, exit_code: i32 },

    /// The system BLAS named by the user could not be used.
    #[error(transparent)]
    Blas(#[from] crate::kernel::gemm::blas::BlasError),

    /// A cluster process or a cluster job failed: the scheduler cannot be
    /// reached, a server cannot start, a job was lost.
    #[error("cluster: {0}")]
    Cluster(String),

    /// A bug in hubnorm.
    #[error("internal error: {0}")]
    Internal(String),

    /// A hubnorm error that reached this process only as text (raised by a
    /// task on a cluster's executor, which sends its message and exit code
    /// within the task's failure text): its message and exit code.
    #[error("{message}")]
    Carried { message: String, exit_code: i32 },
}

impl HubnormError {
    /// Exit code of the command-line tool: 2 for bad input or usage (the user
    /// can fix it), 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            HubnormError::Input { .. }
            | HubnormError::Usage(_)
            | HubnormError::Budget(_)
            | HubnormError::Blas(_) => 2,
            HubnormError::Io { .. }
            | HubnormError::Parquet { .. }
            | HubnormError::Arrow(_)
            | HubnormError::Cluster(_)
            | HubnormError::Internal(_) => 1,
            HubnormError::Interrupted(_) => 130,
            HubnormError::Sql { exit_code, .. }
            | HubnormError::Storage { exit_code, .. }
            | HubnormError::Carried { exit_code, .. } => *exit_code,
        }
    }

    pub(crate) fn input(
        file: impl Into<PathBuf>,
        row: Option<u64>,
        column: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        HubnormError::Input {
            location: Location {
                file: file.into(),
                row,
                column: column.map(str::to_owned),
            },
            message: message.into(),
        }
    }

    /// An I/O failure on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HubnormError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn parquet(path: impl Into<PathBuf>, source: parquet::errors::ParquetError) -> Self {
        HubnormError::Parquet {
            path: path.into(),
            source,
        }
    }
}

/// Where [`HubnormError::carried`] puts an error's exit code and message
/// (errors travel as text only through DataFusion: feature `sql`).
#[cfg(feature = "sql")]
const CARRIED_START: &str = "<<hubnorm exit ";
#[cfg(feature = "sql")]
const CARRIED_END: &str = ">>";

#[cfg(feature = "sql")]
impl HubnormError {
    /// The error as a line of text that keeps its exit code and message
    /// through a cluster: Ballista reports a failed task to the client only
    /// as text (the `Debug` text of its error chain, which escapes quotes and
    /// backslashes). [`HubnormError::from_carried`] reads it back.
    pub(crate) fn carried(&self) -> String {
        format!("{CARRIED_START}{}: {self}{CARRIED_END}", self.exit_code())
    }

    /// The error a text carries ([`HubnormError::carried`], possibly within
    /// a longer text and `Debug`-escaped), as a [`HubnormError::Carried`].
    pub(crate) fn from_carried(text: &str) -> Option<HubnormError> {
        let start = text.find(CARRIED_START)? + CARRIED_START.len();
        let (code, rest) = text[start..].split_once(": ")?;
        let exit_code = code.parse().ok()?;
        let message = &rest[..rest.find(CARRIED_END)?];
        Some(HubnormError::Carried {
            message: unescape_debug(message),
            exit_code,
        })
    }
}

/// `text` with the escapes of a `Debug`-formatted string undone (`\"`,
/// `\\`, `\n`, `\t`, `\r`, `\'`); text without them is unchanged.
#[cfg(feature = "sql")]
fn unescape_debug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// Result alias used throughout the library.
pub type Result<T, E = HubnormError> = std::result::Result<T, E>;

#[cfg(all(test, feature = "sql"))]
mod tests {
    use super::*;

    #[test]
    fn errors_carried_as_text_keep_their_message_and_exit_code() {
        let input = HubnormError::input(
            "/data/gallery \"a\"/part-1.parquet",
            Some(17),
            Some("embedding"),
            "not finite",
        );
        let io = HubnormError::io("/out/x", std::io::Error::from_raw_os_error(libc::EIO));
        for err in [input, io] {
            let carried = err.carried();
            // As Ballista reports it: inside the Debug text of the chain.
            let reported =
                format!("Task failed: DataFusionError(Context({carried:?}, External(..)))");
            for text in [carried.as_str(), reported.as_str()] {
                let back = HubnormError::from_carried(text).expect("carried");
                assert_eq!(back.exit_code(), err.exit_code(), "{text}");
                assert_eq!(back.to_string(), err.to_string(), "{text}");
            }
        }
        assert!(HubnormError::from_carried("Task failed: Execution(\"no marker\")").is_none());
    }
}
