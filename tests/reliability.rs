//! Reliability of long runs: byte-identical outputs whatever the thread
//! count and block schedule, a clean stop on SIGINT (exit 130), no damage
//! from SIGKILL at any point, and `hubnorm stats --resume`, `run --resume`
//! and `compare --resume` after interruptions giving the same files as an
//! uninterrupted run.
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
            checkpoint: Default::default(),
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
        // A killed run's checkpoint is taken up by the next.
        "--resume",
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
    type Point<'a> = (&'a str, Box<dyn Fn() -> bool + 'a>);
    let points: Vec<Point> = vec![
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

    // A checkpoint folder without its manifest (its writing failed, or its
    // removal was cut short) holds nothing: a fresh run and a resume both
    // start afresh, rather than being refused for good.
    for extra in [&[][..], &["--resume"][..]] {
        std::fs::create_dir(&checkpoint).unwrap();
        std::fs::write(checkpoint.join("rows-stray.parquet"), b"partial").unwrap();
        let mut args = stats_args(dir.path(), &out, extra);
        args.push("--overwrite".into());
        hubnorm(&args).output().assert_success();
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&reference).unwrap()
        );
        assert!(!checkpoint.exists(), "{extra:?}");
    }
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

/// `hubnorm run` (or `compare`) over the large case with a method of each
/// family: log-sum-exp (is), activation sets (dis), top-k lists (nnn, csls),
/// moments (mp), Sinkhorn (sn) and a query term (dsl).
fn resumable_args(command: &str, dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let p = |n: &str| dir.join(n).display().to_string();
    let mut list = args(&[
        command,
        "--queries",
        &p("queries.parquet"),
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--methods",
        "is,dis,nnn,csls,mp,sn,dsl",
        "--k",
        "7",
        // Many chunks and query blocks; one thread keeps each phase long
        // enough to be stopped in.
        "--memory-limit",
        "24M",
        "--threads",
        "1",
        "--quiet",
        "--out",
        &out.display().to_string(),
    ]);
    list.extend(extra.iter().map(|s| s.to_string()));
    list
}

/// The files in `dir` whose names start with `prefix`.
fn saved_files(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".parquet") && !n.contains(".open"))
        .collect();
    names.sort();
    names
}

/// SIGKILLs in every phase of `run` (a pass-1 chunk saved, a Sinkhorn
/// iteration saved, a pass-2 query block saved, the outputs being
/// committed) and a SIGINT, each followed by `--resume`: every run goes on
/// from where the last stopped (its saved rows grow from the last end,
/// never restart), no final name ever holds a partial file, and the
/// outputs at the end are the uninterrupted run's, byte for byte.
#[test]
fn resumed_runs_equal_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let reference = dir.path().join("reference");
    hubnorm(resumable_args(
        "run",
        dir.path(),
        &reference,
        &["--no-checkpoint"],
    ))
    .output()
    .assert_success();
    let expected = files(&reference);
    assert_eq!(expected.len(), 3);
    assert!(!reference.join("run.checkpoint").exists());

    let out = dir.path().join("out");
    let checkpoint = out.join("run.checkpoint");
    let (pass1, pass2) = (checkpoint.join("pass1"), checkpoint.join("pass2"));
    let resume = ["--resume", "--checkpoint-interval", "0"];
    let pass1_end = || saved_end(&pass1);
    let pass2_end = || saved_end(&pass2);
    let sweeps = || {
        let path = pass1.join(saved_files(&pass1, "sweeps-").pop()?);
        std::fs::metadata(path).ok()?.modified().ok()
    };
    // What was saved when the current attempt started.
    let before_sweeps = std::cell::Cell::new(None);
    let before = std::cell::Cell::new((0, 0));
    type Point<'a> = (&'a str, Box<dyn Fn() -> bool + 'a>);
    let points: Vec<Point> = vec![
        ("a pass-1 chunk saved", Box::new(|| pass1_end() > 0)),
        (
            "more pass-1 chunks saved",
            Box::new(|| pass1_end() > before.get().0),
        ),
        (
            "a Sinkhorn iteration saved",
            Box::new(|| sweeps().is_some() && sweeps() != before_sweeps.get()),
        ),
        ("a pass-2 query block saved", Box::new(|| pass2_end() > 0)),
        (
            "more query blocks saved",
            Box::new(|| pass2_end() > before.get().1),
        ),
        ("outputs committed", Box::new(|| !files(&out).is_empty())),
    ];
    let mut ends = (0, 0);
    for (when, reached) in &points {
        before_sweeps.set(sweeps());
        before.set((pass1_end(), pass2_end()));
        let mut child = hubnorm(resumable_args("run", dir.path(), &out, &resume)).spawn();
        let start = Instant::now();
        while !reached() && child.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "timed out waiting for {when}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        signal(&child, "KILL");
        let status = child.wait().unwrap();
        // Whatever holds a final name is complete and the reference's.
        for (name, bytes) in files(&out) {
            assert!(
                bytes == expected[&name],
                "after SIGKILL at {when}, {name} is not the complete file"
            );
        }
        // Saved work only grows: a resumed run went on from it.
        let now = (pass1_end(), pass2_end());
        // (A checkpoint without its manifest was being removed.)
        if checkpoint.join("manifest.json").exists() {
            assert!(
                now.0 >= ends.0 && now.1 >= ends.1,
                "after SIGKILL at {when}: saved rows went from {ends:?} to {now:?}"
            );
        }
        eprintln!("SIGKILL at {when} ({status}): saved gallery and query rows {now:?}");
        ends = now;
        if ends.0 > 0 && ends.1 == 0 {
            // Another --precision would count another screen in the summary.
            let mut other = resume.to_vec();
            other.extend(["--precision", "auto"]);
            let output = hubnorm(resumable_args("run", dir.path(), &out, &other)).output();
            assert_eq!(output.code(), Some(2), "{}", output.stderr());
            assert!(
                output.stderr().contains("precision differs"),
                "{}",
                output.stderr()
            );
        }
    }
    let resumable = || checkpoint.join("manifest.json").exists();
    if resumable() {
        // A SIGINT: exit 130, and the message says how to go on.
        let child = hubnorm(resumable_args("run", dir.path(), &out, &resume)).spawn();
        std::thread::sleep(Duration::from_millis(200));
        signal(&child, "INT");
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.code() == Some(130) {
            assert!(stderr.contains("--resume to continue"), "{stderr}");
        }
    }
    // Without --resume a fresh run refuses to discard the checkpoint.
    if resumable() {
        let output = hubnorm(resumable_args("run", dir.path(), &out, &["--overwrite"])).output();
        assert_eq!(output.code(), Some(2), "{}", output.stderr());
        assert!(output.stderr().contains("--resume"));
    }
    if resumable() {
        // A resume may replace the outputs the stopped run had renamed.
        hubnorm(resumable_args("run", dir.path(), &out, &resume))
            .output()
            .assert_success();
    } else if checkpoint.exists() {
        // Killed while removing its checkpoint: every output is in place,
        // and the next run clears what is left of the folder.
        assert_eq!(files(&out), expected);
        let mut again = resume.to_vec();
        again.push("--overwrite");
        hubnorm(resumable_args("run", dir.path(), &out, &again))
            .output()
            .assert_success();
    }
    assert_eq!(files(&out), expected, "the resumed run's outputs differ");
    assert!(
        !checkpoint.exists(),
        "the checkpoint outlived a finished run"
    );
    assert_eq!(temporaries(&out), Vec::<String>::new());
}

/// A run stopped in pass 2 resumes without reading the bank again: pass 1
/// was saved whole, so the resume takes every statistic from the
/// checkpoint. The bank is made unreadable past its first rows after the
/// stop (size and time kept); a fresh run on it fails, the resumed one
/// writes the uninterrupted run's outputs.
#[test]
fn a_resume_after_pass_1_does_not_read_the_bank_again() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let run_args = |out: &Path, extra: &[&str]| {
        let mut list = resumable_args("run", dir.path(), out, extra);
        let methods = list.iter().position(|a| a == "--methods").unwrap() + 1;
        // Every family whose statistics come from the bank's tiles (top-k
        // lists, log-sum-exp, activation sets); Sinkhorn's own resume is
        // tests/sinkhorn.rs's.
        list[methods] = "is,dis,nnn,csls".into();
        list
    };
    let reference = dir.path().join("reference");
    hubnorm(run_args(&reference, &["--no-checkpoint"]))
        .output()
        .assert_success();
    let expected = files(&reference);

    let out = dir.path().join("out");
    let pass2 = out.join("run.checkpoint").join("pass2");
    let mut child = hubnorm(run_args(&out, &["--checkpoint-interval", "0"])).spawn();
    let start = Instant::now();
    while saved_end(&pass2) == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before saving a query block"
        );
        assert!(start.elapsed() < Duration::from_secs(300), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child, "KILL");
    child.wait().unwrap();

    let bank = dir.path().join("bank.parquet");
    break_row_groups(&bank, 1);
    let fresh = hubnorm(run_args(&dir.path().join("fresh"), &[])).output();
    assert_ne!(fresh.code(), Some(0), "a fresh run read the broken bank");
    assert!(
        fresh.stderr().contains("bank.parquet"),
        "{}",
        fresh.stderr()
    );

    hubnorm(run_args(&out, &["--resume"]))
        .output()
        .assert_success();
    assert_eq!(files(&out), expected, "the resumed run's outputs differ");
}

/// `compare --resume` after a SIGKILL in pass 2 writes what an
/// uninterrupted compare writes, every file byte for byte.
#[test]
fn a_resumed_compare_equals_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let reference = dir.path().join("reference");
    hubnorm(resumable_args(
        "compare",
        dir.path(),
        &reference,
        &["--no-checkpoint"],
    ))
    .output()
    .assert_success();
    let out = dir.path().join("out");
    let pass2 = out.join("run.checkpoint").join("pass2");
    let resume = ["--resume", "--checkpoint-interval", "0"];
    let mut child = hubnorm(resumable_args("compare", dir.path(), &out, &resume)).spawn();
    wait_for("a saved query block", &mut child, || saved_end(&pass2) > 0);
    signal(&child, "KILL");
    let _ = child.wait();
    assert!(files(&out).is_empty(), "a killed compare left outputs");
    let output = hubnorm(resumable_args("compare", dir.path(), &out, &resume)).output();
    output.assert_success();
    assert_eq!(files(&out), files(&reference));
    assert!(!out.join("run.checkpoint").exists());
}

/// A file that appears under an output's name while the job runs (another
/// program wrote it; no lock covers it) is kept: without `--overwrite` the
/// commit is refused (exit 2) and the job's file is dropped. The commit is
/// held back for a few seconds with a failpoint, in which the test writes
/// the file.
#[cfg(feature = "failpoints")]
#[test]
fn a_file_that_appears_at_the_output_during_the_job_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    small_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let out = dir.path().join("stats.parquet");
    let child = hubnorm([
        "stats",
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--methods",
        "is",
        "--quiet",
        "--out",
        &p("stats.parquet"),
    ])
    .env("FAILPOINTS", "sink-commit=sleep(3000)")
    .spawn();
    let temporary = dir
        .path()
        .join(format!(".stats.parquet.tmp-{}", child.id()));
    let start = Instant::now();
    while !temporary.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary file"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(&out, b"the user's file").unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("appeared while this job ran"), "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), b"the user's file");
    assert!(!temporary.exists());
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

    // One of its files written alone, and the folder by another name (a
    // symbolic link): the same writer, refused too.
    let rerun = run_args(dir.path(), &out, "5");
    let its_stats = out.join("gallery_stats.parquet");
    let into = stats_args(dir.path(), &its_stats, &["--overwrite"]);
    let (refused, pid, status) = side_by_side(&rerun, &into, &its_stats);
    check_refused(&refused, pid, &its_stats);
    assert!(status.success());
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    let through_link = run_args(dir.path(), &link, "5");
    let (refused, pid, status) = side_by_side(&rerun, &through_link, &out);
    check_refused(&refused, pid, &link);
    assert!(status.success());
    assert!(!its_stats
        .with_file_name(".gallery_stats.parquet.hubnorm-lock")
        .exists());

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

/// Mounts a tmpfs of `size` (as `mount -o size=`) at `disk` (made here),
/// or says why not (mounting needs root; `.ci/run` runs as root).
fn mount_small_disk(disk: &Path, size: &str) -> Option<Mounted> {
    std::fs::create_dir(disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(disk)
        .output();
    match mounted {
        Ok(out) if out.status.success() => Some(Mounted(disk.to_path_buf())),
        other => {
            eprintln!("SKIPPED: cannot mount a small tmpfs here (needs root): {other:?}");
            None
        }
    }
}

/// Fills `disk` up to its last `free` bytes with the file `filler`.
fn fill_disk(filler: &Path, free: u64) {
    use std::io::Write;
    let mut file = std::fs::File::create(filler).unwrap();
    let chunk = vec![7u8; 4096];
    while file.write_all(&chunk).is_ok() {}
    let len = file.metadata().unwrap().len();
    file.set_len(len.saturating_sub(free)).unwrap();
}

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
    let Some(_unmount) = mount_small_disk(&disk, "16m") else {
        return;
    };
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
    fill_disk(&disk.join("filler"), 64 << 10);
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

/// A full disk while a new Delta table is made, with the free space stepped
/// a page at a time across the table's size, so that it runs out while the
/// data file is written, in the first commit, or not at all: a failure exits
/// with 1 and a message naming the table and the full disk, and leaves
/// nothing at the table's path (not even a `_delta_log/` without commits,
/// which the next run would take for an existing table); a success is a
/// table holding every row. Root only, as the full-disk test above.
#[cfg(feature = "delta")]
#[test]
fn a_full_disk_while_making_a_delta_table_leaves_no_table_behind() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let Some(_unmount) = mount_small_disk(&disk, "2m") else {
        return;
    };
    let inputs = dir.path().join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    small_case(&inputs);
    let table = disk.join("stats");
    let stats = || {
        hubnorm([
            "stats",
            "--methods",
            "is",
            "--format",
            "delta",
            "--no-checkpoint",
        ])
        .arg("--gallery")
        .arg(inputs.join("gallery.parquet"))
        .arg("--bank")
        .arg(inputs.join("bank.parquet"))
        .arg("--out")
        .arg(&table)
        .arg("--quiet")
        .output()
    };
    // The table's size, from a table made with room to spare.
    stats().assert_success();
    let page = 4096u64;
    let pages = |path: &Path| std::fs::metadata(path).unwrap().len().div_ceil(page);
    let used: u64 = files_under(&table).iter().map(|p| pages(p)).sum();
    std::fs::remove_dir_all(&table).unwrap();

    let (mut failed_in_commit, mut succeeded) = (false, false);
    for free in used.saturating_sub(2)..=used + 2 {
        let filler = disk.join("filler");
        fill_disk(&filler, free * page);
        let done = stats();
        std::fs::remove_file(&filler).unwrap();
        if done.success() {
            succeeded = true;
            let counted = hubnorm(["sql", "--format", "csv", "SELECT count(*) AS n FROM t"])
                .arg("--table")
                .arg(format!("t={}", table.display()))
                .output();
            counted.assert_success();
            assert_eq!(counted.stdout().split_whitespace().last(), Some("1000"));
            std::fs::remove_dir_all(&table).unwrap();
            continue;
        }
        let err = done.stderr();
        assert_eq!(done.code(), Some(1), "{free} pages free: {err}");
        assert!(err.contains(&table.display().to_string()), "{err}");
        assert!(err.to_lowercase().contains("no space left"), "{err}");
        assert!(
            !table.exists(),
            "{free} pages free: a failed creation left its folder, with files {:?}",
            files_under(&table)
        );
        assert!(stray_files(&disk).is_empty(), "{:?}", stray_files(&disk));
        failed_in_commit |= err.contains("Delta commit");
    }
    assert!(
        failed_in_commit && succeeded,
        "the steps of free space around {used} pages missed the commit (failed there: {failed_in_commit}) or never fit"
    );
}

/// Every temporary or backup a writer may leave beside its outputs: hidden
/// names other than the output locks.
fn stray_files(dir: &Path) -> Vec<String> {
    temporaries(dir)
        .into_iter()
        .filter(|n| !n.ends_with(".hubnorm-lock"))
        .collect()
}

/// A write that fails (EIO, a full disk, a permission taken away) in any
/// sink of any command, at its first or a later write, its footer or its
/// rename into place: exit code 1, a message naming the file and the
/// error, no temporary left, and the previous outputs (several files for
/// `run` and `compare`) byte-identical. Faults come from the `failpoints`
/// build (`FAILPOINTS`, see sink.rs), which CI tests with.
#[test]
fn injected_write_faults_fail_cleanly_and_keep_the_previous_outputs() {
    if !cfg!(feature = "failpoints") {
        eprintln!("SKIPPED: built without the feature `failpoints` (CI builds with it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    small_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let out = |n: &str| dir.path().join("out").join(n);
    std::fs::create_dir_all(out("")).unwrap();
    let reference = dir.path().join("reference");
    // The statistics and results the searches, exports and queries read.
    hubnorm(args(&[
        "run",
        "--queries",
        &p("queries.parquet"),
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--methods",
        "is,nnn",
        "--out",
        reference.to_str().unwrap(),
    ]))
    .output()
    .assert_success();
    let stats = reference
        .join("gallery_stats.parquet")
        .display()
        .to_string();
    let results = reference.join("results.parquet").display().to_string();
    let s = |p: std::path::PathBuf| p.display().to_string();
    // (command line with K for its parameter, the folder its outputs are in)
    let jobs: Vec<(Vec<String>, std::path::PathBuf)> = vec![
        (
            args(&[
                "stats",
                "--gallery",
                &p("gallery.parquet"),
                "--bank",
                &p("bank.parquet"),
                "--methods",
                "is,dis,sn",
                "--beta",
                "K",
                "--no-checkpoint",
                "--out",
                &s(out("stats.parquet")),
            ]),
            out(""),
        ),
        (
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
                "K",
                "--no-checkpoint",
                "--out",
                &s(out("run")),
            ]),
            out("run"),
        ),
        (
            args(&[
                "search",
                "--queries",
                &p("queries.parquet"),
                "--gallery",
                &p("gallery.parquet"),
                "--stats",
                &stats,
                "--methods",
                "is,nnn",
                "--k",
                "K",
                "--out",
                &s(out("search.parquet")),
            ]),
            out(""),
        ),
        (
            args(&[
                "compare",
                "--queries",
                &p("queries.parquet"),
                "--gallery",
                &p("gallery.parquet"),
                "--bank",
                &p("bank.parquet"),
                "--methods",
                "is,csls",
                "--k",
                "K",
                "--no-checkpoint",
                "--out",
                &s(out("compare")),
            ]),
            out("compare"),
        ),
        (
            args(&[
                "export",
                "--gallery",
                &p("gallery.parquet"),
                "--stats",
                &stats,
                "--method",
                "M",
                "--out",
                &s(out("export.parquet")),
            ]),
            out(""),
        ),
        (
            args(&[
                "sql",
                "--table",
                &format!("r={results}"),
                "--format",
                "parquet",
                "--out",
                &s(out("sql.parquet")),
                "SELECT query_id, gallery_id FROM r WHERE rank <= K ORDER BY query_id, rank",
            ]),
            out(""),
        ),
    ];
    let with = |job: &[String], value: &str, overwrite: bool| {
        // K stands for the parameter, also inside the query text (`rank <= K`);
        // M for a method the reference statistics hold.
        let mut list: Vec<String> = job
            .iter()
            .map(|a| match a.as_str() {
                "K" => value.to_owned(),
                "M" => if value == "5" { "is" } else { "nnn" }.to_owned(),
                _ => a.replace("<= K ", &format!("<= {value} ")),
            })
            .collect();
        if overwrite {
            list.push("--overwrite".into());
        }
        list
    };
    let mut failures = 0;
    for (job, folder) in &jobs {
        // The previous outputs, made with one parameter; the faulty runs ask
        // for another, so a new file under a final name would show.
        hubnorm(with(job, "5", true)).output().assert_success();
        let previous = files(folder);
        assert!(!previous.is_empty());
        for point in ["sink-write", "sink-close", "sink-commit"] {
            for (kind, text) in [
                ("eio", "Input/output error"),
                ("enospc", "No space left on device"),
                ("eacces", "Permission denied"),
            ] {
                for skip in [0, 2] {
                    let faults = format!("{point}={skip}*off->return({kind})");
                    let output = hubnorm(with(job, "3", true))
                        .env("FAILPOINTS", &faults)
                        .output();
                    let stderr = output.stderr();
                    let what = format!("`{}` with {faults}", job[0]);
                    if output.code() == Some(0) {
                        // The command has fewer such writes than `skip`:
                        // then nothing failed, and it wrote its outputs.
                        assert!(skip > 0, "{what} did not fail");
                        hubnorm(with(job, "5", true)).output().assert_success();
                        assert_eq!(files(folder), previous);
                        continue;
                    }
                    failures += 1;
                    assert_eq!(output.code(), Some(1), "{what}: {stderr}");
                    assert!(stderr.contains(text), "{what}: {stderr}");
                    assert!(
                        stderr.contains(&dir.path().display().to_string()),
                        "{what} names no file: {stderr}"
                    );
                    assert_eq!(files(folder), previous, "{what} changed the outputs");
                    assert_eq!(stray_files(folder), Vec::<String>::new(), "{what}");
                    assert_eq!(stray_files(&out("")), Vec::<String>::new(), "{what}");
                }
            }
        }
    }
    eprintln!("{failures} injected faults, each failed cleanly");
    assert!(
        failures >= 6 * 3 * 3,
        "too few faults were reached: {failures}"
    );
}

/// A screened pass 1 (`nnn`, `csls`: column top-k lists) stopped after some
/// chunks and resumed reports what the screen did over every chunk, the
/// saved ones too, as the uninterrupted run does, and writes its bytes.
/// The scalar screen runs where the CPU lacks AVX512_BF16.
#[test]
fn a_resumed_screened_pass_1_reports_the_whole_screen() {
    let dir = tempfile::tempdir().unwrap();
    large_case(dir.path());
    let screened = |out: &Path, extra: &[&str]| {
        let mut list = stats_args(dir.path(), out, extra);
        let methods = list.iter().position(|a| a == "is,dis,nnn,csls,sn").unwrap();
        list[methods] = "nnn,csls".into();
        list.extend(args(&["--precision", "screened"]));
        let mut command = hubnorm(list);
        command.env("HUBNORM_SCALAR_SCREEN", "1");
        command
    };
    let screen_line = |stdout: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with("bf16 screen:"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no screen line in:\n{stdout}"))
    };
    let reference = dir.path().join("reference.parquet");
    let output = screened(&reference, &["--no-checkpoint"]).output();
    output.assert_success();
    let whole = screen_line(&output.stdout());

    let out = dir.path().join("stats.parquet");
    let checkpoint = dir.path().join("stats.parquet.checkpoint");
    let mut child = screened(&out, &["--checkpoint-interval", "0", "--resume"]).spawn();
    wait_for("a checkpoint", &mut child, || saved_end(&checkpoint) > 0);
    signal(&child, "INT");
    let stopped = child.wait_with_output().unwrap();
    assert_eq!(
        stopped.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );

    let output = screened(&out, &["--resume"]).output();
    output.assert_success();
    let stdout = output.stdout();
    assert!(stdout.contains("resumed after"), "{stdout}");
    assert_eq!(screen_line(&stdout), whole);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&reference).unwrap()
    );
}

/// A gallery item whose k nearest bank queries are copies of it has no
/// neighbourhood to scale by, however f32 rounds its self-similarity
/// (0.99999994 for some rows): `ls` and `nicdm` refuse it, for every row.
#[test]
fn copies_of_an_item_in_the_bank_leave_it_no_scale_whatever_the_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = write_case(
        d,
        &CaseShape {
            seed: 8,
            gallery: 20,
            queries: 4,
            bank: 5,
            dim: 17,
            noise: 0.1,
        },
    );
    let gallery = random_table(&mut r, "g", 20, 17);
    write_table(
        &d.join("gallery.parquet"),
        &gallery,
        Layout::FixedF32,
        false,
    );
    let p = |n: &str| d.join(n).display().to_string();
    for row in 0..10 {
        let mut bank = random_table(&mut r, "b", 5, 17);
        for copy in 0..3 {
            bank.ids.push(format!("copy{copy}"));
            bank.data.extend_from_slice(gallery.row(row));
        }
        write_table(&d.join("bank.parquet"), &bank, Layout::FixedF32, false);
        for (method, flag) in [("ls", "--ls-k"), ("nicdm", "--ls-k")] {
            let refused = hubnorm(["run", "--queries", &p("queries.parquet")])
                .args([
                    "--gallery",
                    &p("gallery.parquet"),
                    "--bank",
                    &p("bank.parquet"),
                ])
                .args(["--method", method, flag, "3", "--k", "5", "--quiet"])
                .args(["--out", &p(&format!("out-{method}-{row}"))])
                .output();
            assert_eq!(
                refused.code(),
                Some(2),
                "{method}, row {row}: {}",
                refused.stderr()
            );
            assert!(
                refused.stderr().contains(&format!(
                    "gallery row {row} has a bank neighbourhood of scale"
                )),
                "{method}, row {row}: {}",
                refused.stderr()
            );
        }
    }
}

/// A method that refuses its statistics once pass 1 has finished (`ls`: a
/// gallery item whose nearest bank query coincides with it has no scale)
/// exits 2 and leaves no checkpoint: the next run is not told it was
/// interrupted.
#[test]
fn a_refusal_after_pass_1_leaves_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = write_case(
        d,
        &CaseShape {
            seed: 5,
            gallery: 60,
            queries: 10,
            bank: 50,
            dim: 8,
            noise: 0.1,
        },
    );
    // The bank holds gallery row 3 itself.
    let gallery = random_table(&mut r, "g", 60, 8);
    write_table(
        &d.join("gallery.parquet"),
        &gallery,
        Layout::FixedF32,
        false,
    );
    let mut bank = random_table(&mut r, "b", 50, 8);
    bank.ids.push("copy".into());
    bank.data.extend_from_slice(gallery.row(3));
    write_table(&d.join("bank.parquet"), &bank, Layout::FixedF32, false);
    let out = d.join("out");
    let p = |n: &str| d.join(n).display().to_string();
    let run = || {
        hubnorm([
            "run",
            "--queries",
            &p("queries.parquet"),
            "--gallery",
            &p("gallery.parquet"),
            "--bank",
            &p("bank.parquet"),
            "--method",
            "ls",
            "--ls-k",
            "1",
            "--quiet",
            "--out",
            &out.display().to_string(),
        ])
        .output()
    };
    for attempt in 0..2 {
        let refused = run();
        assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
        assert!(
            refused
                .stderr()
                .contains("gallery row 3 has a bank neighbourhood of scale"),
            "attempt {attempt}: {}",
            refused.stderr()
        );
        assert!(!out.exists(), "attempt {attempt}: {:?}", files_under(&out));
    }
}
