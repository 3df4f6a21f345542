//! Reliability of long runs: byte-identical outputs whatever the thread
//! count and block schedule, a clean stop on SIGINT (exit 130), no damage
//! from SIGKILL at any point, and `hubnorm stats --resume` after an
//! interruption giving the same file as an uninterrupted run.
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{self, RunJob};
use hubnorm::progress::Silent;

/// Every method with a gallery statistic (sinkhorn-pp adds nothing here:
/// its per-query state is covered by the same sinks).
fn all_methods() -> Vec<MethodSpec> {
    "none,is,dis,nnn,csls,gc,dn,dual-is,dual-dis,sn,dbsn,dsl"
        .split(',')
        .map(|name| {
            let kind: hubnorm::options::MethodKind = name.parse().unwrap();
            MethodSpec::default_for(kind)
        })
        .collect()
}

/// Small tables: queries, gallery, bank and gallery bank; the bank ×
/// targets similarities of `dbsn` (32 MB) are cached under the default
/// limit but not under the small ones.
fn small_case(dir: &Path) {
    let mut r = write_case(
        dir,
        &CaseShape {
            seed: 808,
            gallery: 1000,
            queries: 250,
            bank: 2000,
            dim: 24,
            noise: 0.3,
        },
    );
    let gallery_bank = random_table(&mut r, "c", 3000, 24);
    write_table(
        &dir.join("gallery_bank.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
}

/// Every file of a folder under a final (not hidden) name, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn outputs_are_byte_identical_across_runs_threads_and_memory_limits() {
    let dir = tempfile::tempdir().unwrap();
    small_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let run = |threads: usize, memory: MemoryBudget, out: &str| {
        let job = RunJob {
            queries: p("queries.parquet"),
            gallery: p("gallery.parquet"),
            bank: p("bank.parquet"),
            gallery_bank: Some(p("gallery_bank.parquet")),
            bank_sample: None,
            transductive: false,
            methods: all_methods(),
            k: 10,
            out_dir: dir.path().join(out),
            overwrite: false,
            options: PassOptions {
                threads,
                memory,
                ..PassOptions::default()
            },
            cluster: None,
        };
        let summary = pipeline::run(&job, &Silent).unwrap();
        // How many blocks each Sinkhorn sweep streamed: the schedule.
        let schedule: Vec<(bool, usize, usize)> = summary
            .methods
            .iter()
            .filter_map(|m| m.sinkhorn.as_ref())
            .map(|s| (s.cached_tiles, s.target_chunks, s.bank_blocks))
            .collect();
        (files(&dir.path().join(out)), schedule)
    };
    let (reference, roomy) = run(1, MemoryBudget::DEFAULT, "reference");
    assert!(
        reference.contains_key("results.parquet")
            && reference.contains_key("gallery_stats.parquet")
    );
    let mut schedules = vec![roomy];
    for (i, (threads, memory)) in [
        (1, MemoryBudget::DEFAULT),
        (2, MemoryBudget::DEFAULT),
        (4, MemoryBudget::DEFAULT),
        (1, MemoryBudget(48 << 20)),
        (2, MemoryBudget(56 << 20)),
        (4, MemoryBudget(80 << 20)),
    ]
    .into_iter()
    .enumerate()
    {
        let (outputs, schedule) = run(threads, memory, &format!("run{i}"));
        assert_eq!(
            outputs.keys().collect::<Vec<_>>(),
            reference.keys().collect::<Vec<_>>()
        );
        for (name, bytes) in &outputs {
            assert!(
                bytes == &reference[name],
                "{name} differs with {threads} threads and --memory-limit {memory}"
            );
        }
        schedules.push(schedule);
    }
    // The small limits really changed the block schedule.
    eprintln!("Sinkhorn schedules (cached, target chunks, bank blocks): {schedules:?}");
    assert!(
        schedules.iter().any(|s| s != &schedules[0]),
        "every run had the same schedule: {schedules:?}"
    );
}

// ------------------------------------------------------------ processes

/// A case big enough that a pass runs for a second or more in a test build,
/// in many chunks under a small memory limit.
fn large_case(dir: &Path) {
    write_case(
        dir,
        &CaseShape {
            seed: 4242,
            gallery: 12_000,
            queries: 3_000,
            bank: 8_000,
            dim: 64,
            noise: 0.3,
        },
    );
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn run_args(dir: &Path, out: &Path, k: &str) -> Vec<String> {
    let p = |n: &str| dir.join(n).display().to_string();
    args(&[
        "run",
        "--queries",
        &p("queries.parquet"),
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--methods",
        "is,nnn",
        "--k",
        k,
        "--memory-limit",
        "32M",
        "--threads",
        "2",
        "--quiet",
        "--overwrite",
        "--out",
        &out.display().to_string(),
    ])
}

/// Hidden temporary files (`.NAME.tmp-PID`, `.NAME.spool…`) in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn sigint_and_sigkill_never_damage_outputs() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let out = dir.path().join("out");
    // The outputs a user already has (k = 5), and what a complete k = 7 run
    // writes (the same bytes every time: outputs are deterministic).
    let finished = |out: &Path, k: &str| {
        hubnorm(run_args(dir.path(), out, k))
            .output()
            .assert_success();
        files(out)
    };
    let old = finished(&out, "5");
    let new = finished(&dir.path().join("complete"), "7");
    assert_eq!(old.len(), 3);

    // SIGINT while pass 1 runs: exit 130, a message, nothing changed or left.
    let mut child = hubnorm(run_args(dir.path(), &out, "7")).spawn();
    wait_for("pass 1 started writing", &mut child, || {
        !temporaries(&out).is_empty()
    });
    signal(&child, "INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted: stopped by a signal"),
        "{stderr}"
    );
    assert_eq!(files(&out), old, "SIGINT changed the outputs");
    assert_eq!(
        temporaries(&out),
        Vec::<String>::new(),
        "SIGINT left temporary files"
    );

    // SIGKILL at several points of a run (phases seen in the folder, and
    // fixed delays): every file under a final name is the old one or the
    // complete new one, never a partial file.
    let temporary = |prefix: &'static str| {
        let out = out.clone();
        move || temporaries(&out).iter().any(|n| n.starts_with(prefix))
    };
    let points: Vec<(&str, Box<dyn Fn() -> bool>)> = vec![
        ("at once", Box::new(|| true)),
        (
            "pass 1 writing",
            Box::new(temporary(".gallery_stats.parquet.tmp-")),
        ),
        (
            "pass 2 writing",
            Box::new(temporary(".results.parquet.tmp-")),
        ),
        ("summary writing", Box::new(temporary(".summary.json.tmp-"))),
        (
            "renaming",
            Box::new(|| files(&out).iter().any(|(n, b)| b != &old[n])),
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    let check = |when: &str, seen: &mut std::collections::BTreeSet<(String, &'static str)>| {
        let now = files(&out);
        assert_eq!(now.len(), 3, "after SIGKILL {when}: {:?}", now.keys());
        for (name, bytes) in now {
            let kind = if bytes == old[&name] {
                "old"
            } else if bytes == new[&name] {
                "new"
            } else {
                panic!("after SIGKILL {when}, {name} is neither the old nor the complete new file")
            };
            seen.insert((name, kind));
        }
    };
    for (when, reached) in &points {
        let mut child = hubnorm(run_args(dir.path(), &out, "7")).spawn();
        let start = Instant::now();
        while !reached()
            && child.try_wait().unwrap().is_none()
            && start.elapsed() < Duration::from_secs(120)
        {
            std::thread::sleep(Duration::from_micros(500));
        }
        signal(&child, "KILL");
        let _ = child.wait();
        check(when, &mut seen);
        // Back to the old outputs for the next point.
        for (name, bytes) in &old {
            std::fs::write(out.join(name), bytes).unwrap();
        }
    }
    for delay_ms in [100u64, 300, 700] {
        let mut child = hubnorm(run_args(dir.path(), &out, "7")).spawn();
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(&child, "KILL");
        let _ = child.wait();
        check(&format!("at {delay_ms} ms"), &mut seen);
    }
    eprintln!("final names seen holding: {seen:?}");
    // A later run removes what the killed ones left behind, and completes.
    hubnorm(run_args(dir.path(), &out, "7"))
        .output()
        .assert_success();
    assert_eq!(files(&out), new);
    assert_eq!(
        temporaries(&out),
        Vec::<String>::new(),
        "stale temporaries were not removed"
    );
}

fn stats_args(dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let p = |n: &str| dir.join(n).display().to_string();
    let mut list = args(&[
        "stats",
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--methods",
        "is,dis,nnn,csls,sn",
        // Small chunks: many checkpoints.
        "--memory-limit",
        "24M",
        "--threads",
        "1",
        "--out",
        &out.display().to_string(),
    ]);
    list.extend(extra.iter().map(|s| s.to_string()));
    list
}

/// The end of the saved gallery rows in `checkpoint` (0: none saved).
fn saved_end(checkpoint: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(checkpoint) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let range = name.strip_prefix("rows-")?.strip_suffix(".parquet")?;
            range.split_once('-')?.1.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn resumed_stats_equal_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let reference = dir.path().join("reference.parquet");
    hubnorm(stats_args(dir.path(), &reference, &["--no-checkpoint"]))
        .output()
        .assert_success();
    assert!(!dir.path().join("reference.parquet.checkpoint").exists());

    let out = dir.path().join("stats.parquet");
    let checkpoint = dir.path().join("stats.parquet.checkpoint");
    for (stop, resumes) in [("KILL", 1), ("INT", 2)] {
        // Stop the run once it has saved more chunks.
        let before = saved_end(&checkpoint);
        let mut child = hubnorm(stats_args(
            dir.path(),
            &out,
            &["--checkpoint-interval", "0", "--resume"],
        ))
        .spawn();
        wait_for("a checkpoint", &mut child, || {
            saved_end(&checkpoint) > before
        });
        signal(&child, stop);
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stop == "INT" {
            assert_eq!(output.status.code(), Some(130), "{stderr}");
            assert!(stderr.contains("--resume to continue"), "{stderr}");
        }
        assert!(!out.exists(), "an interrupted run wrote {}", out.display());
        assert!(checkpoint.join("manifest.json").exists());
        eprintln!("stopped with SIG{stop} ({resumes} interruption(s) so far)");
    }

    // Without --resume a fresh run refuses to discard the checkpoint.
    let output = hubnorm(stats_args(dir.path(), &out, &[])).output();
    assert_eq!(output.code(), Some(2));
    assert!(output.stderr().contains("--resume"));

    // Changed parameters: refused, naming what changed.
    let mut changed = stats_args(dir.path(), &out, &["--resume"]);
    let methods = changed
        .iter()
        .position(|a| a == "is,dis,nnn,csls,sn")
        .unwrap();
    changed[methods] = "is,dis,nnn,csls".into();
    let output = hubnorm(&changed).output();
    let stderr = output.stderr();
    assert_eq!(output.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot resume") && stderr.contains("methods differs"),
        "{stderr}"
    );

    // Resumed: skips the saved rows, and gives the uninterrupted run's bytes.
    let output = hubnorm(stats_args(dir.path(), &out, &["--resume"])).output();
    let stdout = output.stdout();
    output.assert_success();
    assert!(stdout.contains("resumed after"), "{stdout}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&reference).unwrap()
    );
    assert!(
        !checkpoint.exists(),
        "the checkpoint outlived a finished run"
    );
}

#[test]
fn resume_refuses_changed_inputs() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let out = dir.path().join("stats.parquet");
    let checkpoint = dir.path().join("stats.parquet.checkpoint");
    let mut child = hubnorm(stats_args(
        dir.path(),
        &out,
        &["--checkpoint-interval", "0"],
    ))
    .spawn();
    wait_for("a checkpoint", &mut child, || saved_end(&checkpoint) > 0);
    signal(&child, "KILL");
    let _ = child.wait();
    // The bank is rewritten (same name, new contents and time).
    std::thread::sleep(Duration::from_millis(20));
    let mut r = rng(99);
    let bank = random_table(&mut r, "b", 8_000, 64);
    write_table(
        &dir.path().join("bank.parquet"),
        &bank,
        Layout::FixedF32,
        false,
    );
    let output = hubnorm(stats_args(dir.path(), &out, &["--resume"])).output();
    let stderr = output.stderr();
    assert_eq!(output.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the bank files changed"), "{stderr}");
    assert!(!out.exists());
    // Nothing of the user's was deleted: the checkpoint is still there.
    assert!(saved_end(&checkpoint) > 0);
}

/// Two processes given the same output at once: the second is refused at
/// start (exit code 2) naming the first, which finishes undisturbed; the
/// same for `run` directories and for `stats --update` of a file that
/// another process is updating. Real processes, started side by side.
#[test]
fn a_second_writer_of_the_same_output_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let bin = env!("CARGO_BIN_EXE_hubnorm");
    let stats = dir.path().join("stats.parquet");
    let lock_of = |output: &Path| {
        let name = output.file_name().unwrap().to_string_lossy().into_owned();
        output.with_file_name(format!(".{name}.hubnorm-lock"))
    };
    // Starts `first`, waits until it holds the lock of `output`, runs
    // `second` meanwhile; returns the second's output and the first's status.
    let side_by_side = |first: &[String], second: &[String], output: &Path| {
        let mut running = std::process::Command::new(bin)
            .args(first)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !lock_of(output).exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the first process never took its lock"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let refused = std::process::Command::new(bin)
            .args(second)
            .output()
            .unwrap();
        let pid = running.id();
        let status = running.wait().unwrap();
        (refused, pid, status)
    };
    let check_refused = |refused: &std::process::Output, pid: u32, output: &Path| {
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{err}");
        assert!(err.contains("another hubnorm process"), "{err}");
        assert!(err.contains(&format!("process {pid}")), "{err}");
        assert!(err.contains(&output.display().to_string()), "{err}");
    };

    let job = stats_args(dir.path(), &stats, &[]);
    let (refused, pid, status) = side_by_side(&job, &job, &stats);
    check_refused(&refused, pid, &stats);
    assert!(status.success());
    assert!(stats.exists());
    assert!(
        !lock_of(&stats).exists(),
        "the lock file stays after a clean exit"
    );
    let complete = std::fs::read(&stats).unwrap();

    // `stats --update` of a file that another process is writing.
    let rewrite = stats_args(dir.path(), &stats, &["--overwrite"]);
    let update: Vec<String> = stats_args(dir.path(), &stats, &["--update"])
        .into_iter()
        .filter(|a| a != "--methods" && a != "is,dis,nnn,csls,sn")
        .collect();
    let (refused, pid, status) = side_by_side(&rewrite, &update, &stats);
    check_refused(&refused, pid, &stats);
    assert!(status.success());
    assert_eq!(std::fs::read(&stats).unwrap(), complete);

    // A run directory.
    let out = dir.path().join("run");
    let job = run_args(dir.path(), &out, "5");
    let (refused, pid, status) = side_by_side(&job, &job, &out);
    check_refused(&refused, pid, &out);
    assert!(status.success());
    assert!(out.join("results.parquet").exists());

    // A lock left by a killed process is taken over.
    let mut killed = std::process::Command::new(bin)
        .args(stats_args(
            dir.path(),
            &dir.path().join("again.parquet"),
            &["--no-checkpoint"],
        ))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let again = dir.path().join("again.parquet");
    while !lock_of(&again).exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    killed.kill().unwrap();
    killed.wait().unwrap();
    let status = std::process::Command::new(bin)
        .args(stats_args(dir.path(), &again, &["--no-checkpoint"]))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(std::fs::read(&again).unwrap(), complete);
}

/// Unmounts a test's file system when the test ends, however it ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk in the middle of writing: exit code 1, a message naming the
/// output, no temporary file left, and the output the user had intact. The
/// disk is a small tmpfs the test mounts (root only: skipped, loudly,
/// where the machine does not allow it; `.ci/run` runs it as root).
#[test]
fn a_full_disk_fails_cleanly_and_keeps_the_previous_output() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&disk)
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!("SKIPPED: cannot mount a small tmpfs here (needs root): {other:?}");
            return;
        }
    }
    let _unmount = Mounted(disk.clone());
    let small = dir.path().join("small");
    let large = dir.path().join("large");
    std::fs::create_dir(&small).unwrap();
    std::fs::create_dir(&large).unwrap();
    small_case(&small);
    large_case(&large);
    let bin = env!("CARGO_BIN_EXE_hubnorm");
    let out = disk.join("stats.parquet");
    let stats = |inputs: &Path, extra: &[&str]| {
        let p = |n: &str| inputs.join(n).display().to_string();
        let mut args = vec![
            "stats".to_string(),
            "--gallery".into(),
            p("gallery.parquet"),
            "--bank".into(),
            p("bank.parquet"),
            "--methods".into(),
            "is,nnn,csls,dis".into(),
            "--out".into(),
            out.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        std::process::Command::new(bin).args(args).output().unwrap()
    };
    // The output the user has: small enough for the disk.
    let first = stats(&small, &[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let before = std::fs::read(&out).unwrap();
    // The disk filled up to its last 64 KiB.
    let filler = disk.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 4096];
        while file.write_all(&chunk).is_ok() {}
        let len = file.metadata().unwrap().len();
        file.set_len(len.saturating_sub(64 << 10)).unwrap();
    }
    // Twelve times the gallery: its statistics do not fit in what is left.
    let full = stats(&large, &["--overwrite", "--no-checkpoint"]);
    let err = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(1), "{err}");
    assert!(err.contains("stats.parquet"), "{err}");
    assert!(
        err.to_lowercase().contains("no space left"),
        "the message says what happened: {err}"
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the previous output changed"
    );
    let mut left: Vec<String> = std::fs::read_dir(&disk)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["filler", "stats.parquet"], "temporaries left");
}
