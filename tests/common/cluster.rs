//! A real cluster for the tests: `hubnorm cluster scheduler` and `hubnorm
//! cluster executor` processes on free ports of 127.0.0.1, each stopped by
//! its process id when the [`Cluster`] is dropped, also when a test fails
//! (then their logs are printed).
//!
//! Every process logs to its own file (a pipe nobody reads would fill and
//! block it). The scheduler takes port 0 and prints the port it got; the
//! executors register with it, which its `/readyz` reports.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variables of one process.
pub type Env = Vec<(String, String)>;

/// A process of the cluster and its log.
struct Process {
    role: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(role: &str, args: &[String], cwd: &Path, env: &Env, logs: &Path) -> Process {
        let log = logs.join(format!("{}.log", role.replace(' ', "-")));
        let file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_hubnorm"));
        command
            .args(args)
            .current_dir(cwd)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {role}: {e}"));
        Process {
            role: role.to_owned(),
            child,
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log when the process has ended.
    fn assert_running(&mut self, waiting_for: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "the {} ended ({status}) before {waiting_for}; its log:\n{}",
                self.role,
                self.log_text()
            );
        }
    }

    /// Signal `name` (TERM, INT), then its exit status (SIGKILL after `grace`).
    fn stop(&mut self, name: &str, grace: Duration) -> ExitStatus {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status;
        }
        super::signal(&self.child, name);
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }
}

/// A scheduler and its executors.
pub struct Cluster {
    scheduler: Process,
    executors: Vec<Process>,
    port: u16,
    stopped: bool,
}

impl Cluster {
    /// Starts a scheduler (with `scheduler_env`) and one executor per entry
    /// of `executor_envs` (one task slot each), all in `cwd`, logging into
    /// `logs`, and waits until every executor has registered.
    pub fn start(cwd: &Path, logs: &Path, scheduler_env: &Env, executor_envs: &[Env]) -> Cluster {
        Self::start_with(cwd, logs, &[], "512MiB", scheduler_env, executor_envs)
    }

    /// [`Cluster::start`] with more arguments for the scheduler and the
    /// executors' `--memory-limit`.
    pub fn start_with(
        cwd: &Path,
        logs: &Path,
        scheduler_args: &[&str],
        executor_memory: &str,
        scheduler_env: &Env,
        executor_envs: &[Env],
    ) -> Cluster {
        std::fs::create_dir_all(logs).unwrap();
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut scheduler_command = args(&["cluster", "scheduler", "--bind", "127.0.0.1:0"]);
        scheduler_command.extend(args(scheduler_args));
        let scheduler = Process::start("scheduler", &scheduler_command, cwd, scheduler_env, logs);
        let mut cluster = Cluster {
            scheduler,
            executors: Vec::new(),
            port: 0,
            stopped: false,
        };
        cluster.port = cluster.wait_for_port();
        for (i, env) in executor_envs.iter().enumerate() {
            let process = Process::start(
                &format!("executor {i}"),
                &args(&[
                    "cluster",
                    "executor",
                    "--scheduler",
                    &format!("127.0.0.1:{}", cluster.port),
                    "--bind",
                    "127.0.0.1:0",
                    "--threads",
                    "1",
                    "--memory-limit",
                    executor_memory,
                ]),
                cwd,
                env,
                logs,
            );
            cluster.executors.push(process);
        }
        cluster.wait_for_executors(executor_envs.len());
        cluster
    }

    /// `df://127.0.0.1:PORT`, for `hubnorm sql --cluster`.
    pub fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// The scheduler's port, from its start-up line.
    fn wait_for_port(&mut self) -> u16 {
        const LINE: &str = "hubnorm cluster scheduler listening on 127.0.0.1:";
        let start = Instant::now();
        loop {
            let log = self.scheduler.log_text();
            if let Some(rest) = log.split(LINE).nth(1) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                return digits.parse().unwrap();
            }
            self.scheduler.assert_running("listening");
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the scheduler did not start listening; its log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the scheduler's `/readyz` counts `n` executors.
    fn wait_for_executors(&mut self, n: usize) {
        let expected = format!("ready: {n} executors registered");
        let start = Instant::now();
        loop {
            let said = self.readyz().unwrap_or_default();
            if said.contains(&expected) {
                return;
            }
            self.scheduler.assert_running("the executors registered");
            for executor in &mut self.executors {
                executor.assert_running("registering");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{n} executors did not register (readyz: {said}); logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The body of `GET /readyz` on the scheduler's port.
    fn readyz(&self) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    }

    /// `VmRSS` and `VmHWM` (peak) of executor `i`, in bytes.
    pub fn executor_memory(&self, i: usize) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.executors[i].child.id()))
                .unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .and_then(|kib| kib.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc status"))
                * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// The scheduler's log.
    pub fn scheduler_log(&self) -> String {
        self.scheduler.log_text()
    }

    /// The log of executor `i`.
    pub fn executor_log(&self, i: usize) -> String {
        self.executors[i].log_text()
    }

    /// The Arrow Flight port of executor `i`, from its start-up line.
    pub fn executor_flight_port(&self, i: usize) -> u16 {
        const LINE: &str = "serving Arrow Flight on 127.0.0.1:";
        let log = self.executors[i].log_text();
        let rest = log
            .split(LINE)
            .nth(1)
            .unwrap_or_else(|| panic!("no start-up line in the log of executor {i}:\n{log}"));
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap()
    }

    /// The work directory of executor `i`, from its start-up line.
    pub fn executor_work_dir(&self, i: usize) -> PathBuf {
        let log = self.executors[i].log_text();
        let path = log
            .split("work directory ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap_or_else(|| panic!("no start-up line in the log of executor {i}:\n{log}"));
        PathBuf::from(path)
    }

    /// Kills executor `i` with SIGKILL (no notice to the scheduler).
    pub fn kill_executor(&mut self, i: usize) {
        self.executors[i].child.kill().unwrap();
        self.executors[i].child.wait().unwrap();
    }

    /// Kills the scheduler with SIGKILL.
    pub fn kill_scheduler(&mut self) {
        self.scheduler.child.kill().unwrap();
        self.scheduler.child.wait().unwrap();
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        std::iter::once(&self.scheduler)
            .chain(&self.executors)
            .map(|p| format!("--- {} ---\n{}", p.role, p.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the executors by SIGTERM, then the scheduler by SIGINT (Ctrl-C),
    /// each signal sent to its process id; their exit statuses in that
    /// order, with their logs.
    pub fn stop(mut self) -> Vec<(String, ExitStatus, String)> {
        self.stopped = true;
        let mut statuses = Vec::new();
        for process in &mut self.executors {
            let status = process.stop("TERM", Duration::from_secs(60));
            statuses.push((process.role.clone(), status, process.log_text()));
        }
        let status = self.scheduler.stop("INT", Duration::from_secs(60));
        statuses.push(("scheduler".into(), status, self.scheduler.log_text()));
        statuses
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if std::thread::panicking() {
            eprintln!("cluster logs:\n{}", self.logs());
        }
        for process in self.executors.iter_mut().chain([&mut self.scheduler]) {
            process.stop("TERM", Duration::from_secs(5));
        }
    }
}
