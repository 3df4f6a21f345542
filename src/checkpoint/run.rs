//! The checkpoint of a run folder, so that `hubnorm run --resume` (and
//! `compare --resume`) continue an interrupted run from where it stopped:
//!
//! ```text
//! OUT/run.checkpoint/
//!   manifest.json   the run's inputs and parameters
//!   pass1/          pass 1's checkpoint: finished gallery chunks, activation
//!                   states, Sinkhorn potentials (see the parent module)
//!   pass2/          finished query rows: rows-<first>-<end>.parquet
//! ```
//!
//! Pass 1's checkpoint stays until the run's outputs are committed: a run
//! stopped in pass 2 rebuilds its stats file from the saved rows and
//! potentials without a single similarity. Pass 2's files hold every list of
//! their queries down to the depth the reports need, with the report
//! columns, so the summary's figures are rebuilt from them exactly as a
//! cluster's client rebuilds them from its tasks' rows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Checkpoint, CheckpointOptions, MANIFEST};
use crate::error::{HubnormError, Result};

/// The checkpoint folder of a run writing into `out_dir`.
pub fn run_checkpoint_dir(out_dir: &Path) -> PathBuf {
    out_dir.join("run.checkpoint")
}

/// The checkpoint of a run: where its passes' checkpoints live.
pub struct RunCheckpoint {
    dir: PathBuf,
    /// The output folder, when the checkpoint created it (removed with the
    /// checkpoint when nothing else went into it).
    created_out_dir: Option<PathBuf>,
    command: &'static str,
    manifest: BTreeMap<String, String>,
    /// The sub-checkpoints are opened as resumable: the folder as a whole
    /// was checked against `--resume` when it was opened.
    options: CheckpointOptions,
}

impl RunCheckpoint {
    /// Opens the checkpoint of `hubnorm COMMAND` writing into `out_dir`,
    /// with the run's inputs and parameters `manifest`: `None` when
    /// checkpoints are off. Refuses to start afresh over a checkpoint an
    /// interrupted run left (unless `options.resume`), and to resume one
    /// made with other inputs or parameters.
    pub fn open(
        out_dir: &Path,
        command: &'static str,
        manifest: BTreeMap<String, String>,
        options: &CheckpointOptions,
    ) -> Result<Option<RunCheckpoint>> {
        let interval = match (options.interval, options.resume) {
            (Some(interval), _) => interval,
            (None, true) => CheckpointOptions::DEFAULT_INTERVAL,
            (None, false) => return Ok(None),
        };
        let dir = run_checkpoint_dir(out_dir);
        let created_out_dir = (!crate::storage::is_remote(out_dir)
            && !crate::storage::exists(out_dir)?)
        .then(|| out_dir.to_path_buf());
        // A folder without its manifest was being removed by a run that
        // had finished: nothing in it is needed.
        if crate::storage::is_dir(&dir)? && !crate::storage::exists(&dir.join(MANIFEST))? {
            crate::storage::remove_dir_all(&dir)?;
        }
        let resume_tag = if crate::storage::is_dir(&dir)? {
            if !options.resume {
                return Err(HubnormError::Usage(format!(
                    "an interrupted `hubnorm {command}` left a checkpoint at {}: pass --resume to continue it, or delete that folder to start afresh",
                    dir.display()
                )));
            }
            super::check_manifest(&dir, &manifest)?
        } else {
            Some(super::write_manifest(&dir, &manifest)?)
        };
        if let Some(tag) = &resume_tag {
            crate::sink::tag_delta_outputs(out_dir, tag);
        }
        Ok(Some(RunCheckpoint {
            dir,
            created_out_dir,
            command,
            manifest,
            options: CheckpointOptions {
                interval: Some(interval),
                resume: true,
            },
        }))
    }

    /// Whether a run writing into `out_dir` left a checkpoint to resume.
    pub fn exists(out_dir: &Path) -> Result<bool> {
        crate::storage::exists(&run_checkpoint_dir(out_dir).join(MANIFEST))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What a run that failed with `err` leaves: the checkpoint when it
    /// `saved` any work and a retry can use it (an interruption, a failing
    /// disk or store; an interruption's message then says how to go on),
    /// nothing otherwise: bad input or usage (exit code 2) is fixed by
    /// changing the inputs, which the checkpoint would refuse, and an
    /// empty checkpoint would only block the next run.
    pub fn after_failure(self, err: HubnormError, saved: bool) -> HubnormError {
        if !saved || err.exit_code() == 2 {
            // The failure is what to report, not a checkpoint that cannot
            // be removed.
            let _ = crate::cancel::finishing(|| self.remove());
            return err;
        }
        match err {
            HubnormError::Interrupted(message) => HubnormError::Interrupted(format!(
                "{message}; the finished work is saved in {}: run the same command with --resume to continue",
                self.dir.display()
            )),
            err => err,
        }
    }

    /// Pass 1's checkpoint (`saves_activation`: some method keeps
    /// activation states across chunks).
    pub fn pass1(&self, saves_activation: bool) -> Result<Checkpoint> {
        self.open_pass("pass1", saves_activation)
    }

    /// Pass 2's checkpoint (its rows count query rows).
    pub fn pass2(&self) -> Result<Checkpoint> {
        self.open_pass("pass2", false)
    }

    fn open_pass(&self, name: &str, saves_activation: bool) -> Result<Checkpoint> {
        Checkpoint::open_dir(
            &self.dir.join(name),
            self.command,
            &self.manifest,
            &self.options,
            saves_activation,
        )
        .map(|c| c.expect("checkpoints are on"))
    }

    /// Deletes the checkpoint (the run's outputs are committed). The
    /// manifest goes first, so a folder left half-deleted is never resumed.
    pub fn remove(self) -> Result<()> {
        crate::storage::remove_file(&self.dir.join(MANIFEST))?;
        crate::storage::remove_dir_all(&self.dir)?;
        if let Some(out_dir) = &self.created_out_dir {
            // Only an empty folder goes.
            let _ = std::fs::remove_dir(out_dir);
        }
        Ok(())
    }
}
