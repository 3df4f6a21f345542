//! Object storage in a build without the `cloud` feature (the fuzz
//! targets): every URL is refused, so none of these values can exist.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::{HubnormError, Result};

/// An object-store URL (none can be made in this build).
#[derive(Debug, Clone)]
pub enum ObjectUrl {}

/// A remote Parquet object (none can be opened in this build).
#[derive(Debug, Clone)]
pub enum RemoteFile {}

/// A reader over a [`RemoteFile`] (none exists in this build).
pub enum RemoteRead {}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl ObjectUrl {
    pub fn parse(text: &str) -> Result<ObjectUrl> {
        Err(HubnormError::Usage(format!(
            "{text}: this build of hubnorm has no object storage (the `cloud` feature)"
        )))
    }
    pub(crate) fn check_writable(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn check_names_object(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn exists(&self) -> Result<bool> {
        match *self {}
    }
    pub(crate) fn has_children(&self) -> Result<bool> {
        match *self {}
    }
    pub(crate) fn read_to_string(&self) -> Result<String> {
        match *self {}
    }
    pub(crate) fn rename_to(&self, _: &ObjectUrl) -> Result<()> {
        match *self {}
    }
    pub(crate) fn delete(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn delete_prefix(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn list_children(&self) -> Result<Vec<String>> {
        match *self {}
    }
    pub(crate) fn identity(&self) -> Result<super::Identity> {
        match *self {}
    }
    pub(crate) fn expand(&self) -> Result<Vec<PathBuf>> {
        match *self {}
    }
    pub(crate) fn expand_identified(&self) -> Result<Vec<(PathBuf, super::Identity)>> {
        match *self {}
    }
    pub(crate) fn upload_from(&self, _: &Path) -> Result<()> {
        match *self {}
    }
}

impl RemoteFile {
    pub(crate) fn open(url: &ObjectUrl) -> Result<RemoteFile> {
        match *url {}
    }
    pub fn size(&self) -> u64 {
        match *self {}
    }
    pub(crate) fn set_chunks(&self, _: Vec<std::ops::Range<u64>>) {
        match *self {}
    }
    pub fn set_window_bytes(&self, _: usize) {
        match *self {}
    }
    pub fn failure(&self) -> Option<String> {
        match *self {}
    }
}

impl parquet::file::reader::Length for RemoteFile {
    fn len(&self) -> u64 {
        match *self {}
    }
}

impl parquet::file::reader::ChunkReader for RemoteFile {
    type T = RemoteRead;
    fn get_read(&self, _: u64) -> parquet::errors::Result<RemoteRead> {
        match *self {}
    }
    fn get_bytes(&self, _: u64, _: usize) -> parquet::errors::Result<Bytes> {
        match *self {}
    }
}

impl std::io::Read for RemoteRead {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        match *self {}
    }
}

pub(crate) fn configure(options: &[(String, String)]) -> Result<()> {
    match options.first() {
        None => Ok(()),
        Some((key, _)) => Err(HubnormError::Usage(format!(
            "--storage-option {key}: this build of hubnorm has no object storage (the `cloud` feature)"
        ))),
    }
}

pub(crate) fn redact(message: &str) -> String {
    message.to_owned()
}

/// No object can be read in this build.
pub(crate) fn read_buffer_bytes_for(_: usize) -> usize {
    0
}

pub(crate) fn window_bytes_for(batch_bytes: usize) -> usize {
    batch_bytes
}
