//! nginx as the pods run it: the release of Debian unstable (1.30), installed with its own libc
//! and OpenSSL in a root of its own by `scripts/install-test-deps.sh` (the host's are too old for
//! it), and run inside that root with bubblewrap.
//!
//! A [`Sandbox`] is the root, read-only, with what the test adds: its directories bound at their
//! own paths (so configurations naming absolute paths run unchanged), an /etc/hosts, tmpfs mounts
//! as a pod's emptyDirs, a uid. The network is the host's: nginx listens on and connects to
//! loopback addresses as any other process of the test.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::net::TcpStream;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming the root, when it is not at [`DEFAULT_ROOT`].
pub const ROOT_ENV: &str = "CDN_TEST_NGINX_ROOT";
/// Where `scripts/install-test-deps.sh` makes the root.
pub const DEFAULT_ROOT: &str = "/opt/cdn-operator-test/nginx-root";
/// The nginx release the pods run, as `nginx -v` names it: the tests run no other.
pub const VERSION_PREFIX: &str = "nginx/1.30.";

/// How long nginx may take to listen, or to stop once asked.
const PATIENCE: Duration = Duration::from_secs(10);

/// An nginx log as it stands once nginx has written what it served: nginx logs a request after
/// its last byte, so an answer can arrive before its line. Read until the log stays the same for
/// 20 ms; empty when there is no log yet.
pub fn settled_log(path: &Path) -> String {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    let mut log = read();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let again = read();
        if again == log {
            return log;
        }
        log = again;
    }
}

/// The root nginx runs in; panics, saying how to make it, when there is none.
pub fn root() -> PathBuf {
    let root = std::env::var_os(ROOT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_ROOT.into());
    assert!(
        root.join("usr/sbin/nginx").is_file(),
        "no nginx root at {} ({ROOT_ENV} overrides {DEFAULT_ROOT}): run scripts/install-test-deps.sh \
         (./test.sh does)",
        root.display()
    );
    root
}

/// What is mounted at one path of the sandbox.
#[derive(Clone, Debug)]
enum Mount {
    Bind { source: PathBuf, writable: bool },
    Tmpfs { mode: u32 },
}

/// The file system and user nginx runs with; [`Sandbox::command`] makes the `bwrap` command.
///
/// The root is read-only. Where a mount point is missing from it (a pod's /etc/nginx/cdn), the
/// directories on the way are rebuilt as tmpfs holding the root's entries, so the shared root is
/// never written to.
#[derive(Clone, Debug)]
pub struct Sandbox {
    root: PathBuf,
    mounts: BTreeMap<PathBuf, Mount>,
    /// uid and gid, when not root.
    user: Option<(u32, u32)>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// The [`root`], read-only, with a /tmp of its own (empty, writable) and nothing of the host.
    pub fn new() -> Sandbox {
        let mut sandbox = Sandbox::read_only_root();
        sandbox
            .mounts
            .insert("/tmp".into(), Mount::Tmpfs { mode: 0o1777 });
        sandbox
    }

    /// The [`root`], read-only, nothing writable: a pod's readOnlyRootFilesystem, to which its
    /// volumes are added.
    pub fn read_only_root() -> Sandbox {
        Sandbox::in_root(root())
    }

    /// Another root, read-only, nothing writable.
    fn in_root(root: PathBuf) -> Sandbox {
        Sandbox {
            root,
            mounts: BTreeMap::new(),
            user: None,
        }
    }

    /// `dir` of the host, writable, at its own path.
    pub fn share(mut self, dir: impl AsRef<Path>) -> Sandbox {
        let dir = absolute(dir.as_ref());
        self.mounts.insert(
            dir.clone(),
            Mount::Bind {
                source: dir,
                writable: true,
            },
        );
        self
    }

    /// `source` of the host, read-only, at `target`.
    pub fn read_only(mut self, source: impl AsRef<Path>, target: impl AsRef<Path>) -> Sandbox {
        self.mounts.insert(
            absolute(target.as_ref()),
            Mount::Bind {
                source: absolute(source.as_ref()),
                writable: false,
            },
        );
        self
    }

    /// `file` as /etc/hosts: how nginx resolves names when it loads a configuration.
    pub fn hosts(self, file: impl AsRef<Path>) -> Sandbox {
        self.read_only(file, "/etc/hosts")
    }

    /// `file` as /etc/resolv.conf.
    pub fn resolv_conf(self, file: impl AsRef<Path>) -> Sandbox {
        self.read_only(file, "/etc/resolv.conf")
    }

    /// `source` of the host, writable, at `target`: an emptyDir that outlives a container, as
    /// one does when the kubelet restarts a container of its pod.
    pub fn volume(mut self, source: impl AsRef<Path>, target: impl AsRef<Path>) -> Sandbox {
        self.mounts.insert(
            absolute(target.as_ref()),
            Mount::Bind {
                source: absolute(source.as_ref()),
                writable: true,
            },
        );
        self
    }

    /// An empty tmpfs anyone may write to at `target`, as a Kubernetes emptyDir.
    pub fn empty_dir(mut self, target: impl AsRef<Path>) -> Sandbox {
        self.mounts
            .insert(absolute(target.as_ref()), Mount::Tmpfs { mode: 0o777 });
        self
    }

    /// Runs the command as `uid` and `gid`, with no supplementary group and no capability, as a
    /// pod's runAsUser and runAsGroup do.
    pub fn user(mut self, uid: u32, gid: u32) -> Sandbox {
        self.user = Some((uid, gid));
        self
    }

    /// Whether `path` of the host is visible and writable at its own path.
    fn shares(&self, path: &Path) -> bool {
        let path = absolute(path);
        self.mounts.iter().any(|(target, mount)| {
            matches!(mount, Mount::Bind { source, writable: true } if source == target)
                && path.starts_with(target)
        })
    }

    /// `argv` (program and arguments, a container's command word for word) in the sandbox.
    ///
    /// The sandbox has a PID namespace of its own whose init is bubblewrap's, which dies with
    /// the process that spawned it (`--die-with-parent`): nginx and its workers end with the
    /// test even if it is killed. That parent is the spawning *thread*: spawn from the thread
    /// that owns the handle, not from a helper thread that ends first.
    pub fn command<S: AsRef<OsStr>>(&self, argv: &[S]) -> Command {
        let mut command = Command::new("bwrap");
        command
            .args(self.bwrap_args())
            .args(["--unshare-pid", "--die-with-parent", "--chdir", "/"])
            .args(["--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]);
        if let Some((uid, gid)) = self.user {
            // setpriv sets the saved uid too, so all of them are non-zero and the kernel drops
            // every capability.
            command.args([
                "setpriv".to_string(),
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
            ]);
        }
        command.args(argv);
        command
    }

    /// `nginx ARGS` in the sandbox.
    pub fn nginx<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut argv: Vec<OsString> = vec!["nginx".into()];
        argv.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self.command(&argv)
    }

    /// The directories of the root that become tmpfs holding the root's entries, because a
    /// mount point is missing under them; always "/", bubblewrap's own tmpfs.
    fn rebuilt(&self) -> BTreeSet<PathBuf> {
        let mut rebuilt = BTreeSet::from([PathBuf::from("/")]);
        for target in self.mounts.keys() {
            if self.host_path(target).symlink_metadata().is_ok() {
                continue;
            }
            for ancestor in target
                .ancestors()
                .skip(1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                // Under a mount of the sandbox's own, or a directory missing from the root,
                // bubblewrap can make the mount point.
                if self.mounts.contains_key(ancestor) {
                    break;
                }
                match self.host_path(ancestor).symlink_metadata() {
                    Ok(meta) if meta.is_dir() => rebuilt.insert(ancestor.to_path_buf()),
                    _ => break,
                };
            }
        }
        rebuilt
    }

    fn host_path(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    fn bwrap_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut arg = |a: &[&OsStr]| args.extend(a.iter().map(|s| s.to_os_string()));
        let rebuilt = self.rebuilt();
        for dir in &rebuilt {
            let top = dir == Path::new("/");
            if !top {
                arg(&["--tmpfs".as_ref(), dir.as_os_str()]);
            }
            let source = self.host_path(dir);
            let mut entries: Vec<_> = std::fs::read_dir(&source)
                .unwrap_or_else(|e| panic!("reading {}: {e}", source.display()))
                .map(|e| e.expect("a directory entry").file_name())
                .collect();
            entries.sort();
            for name in entries {
                let path = dir.join(&name);
                let special = top && (name == "dev" || name == "proc");
                if special || rebuilt.contains(&path) || self.mounts.contains_key(&path) {
                    continue;
                }
                let from = source.join(&name);
                match std::fs::read_link(&from) {
                    Ok(link) => arg(&["--symlink".as_ref(), link.as_os_str(), path.as_os_str()]),
                    Err(_) => arg(&["--ro-bind".as_ref(), from.as_os_str(), path.as_os_str()]),
                }
            }
            if top {
                arg(&[
                    "--dev".as_ref(),
                    "/dev".as_ref(),
                    "--proc".as_ref(),
                    "/proc".as_ref(),
                ]);
            }
        }
        // Parents before children: the map is ordered by path.
        for (target, mount) in &self.mounts {
            match mount {
                Mount::Bind { source, writable } => {
                    let how = if *writable { "--bind" } else { "--ro-bind" };
                    arg(&[how.as_ref(), source.as_os_str(), target.as_os_str()]);
                }
                Mount::Tmpfs { mode } => {
                    let mode = format!("{mode:o}");
                    arg(&["--perms".as_ref(), mode.as_ref()]);
                    arg(&["--tmpfs".as_ref(), target.as_os_str()]);
                }
            }
        }
        for dir in &rebuilt {
            arg(&["--remount-ro".as_ref(), dir.as_os_str()]);
        }
        args
    }
}

/// `path` made absolute against the current directory, without `.` or `..`.
fn absolute(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).expect("an absolute path");
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    clean
}

/// What `nginx -v` says, e.g. "nginx version: nginx/1.30.6".
pub fn version(sandbox: &Sandbox) -> String {
    let out = run(sandbox.nginx(&["-v"]));
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// `nginx -t` of the configuration file `conf` (which the sandbox must see): `Ok` with nginx's
/// report when it accepts it, `Err` with the report otherwise.
pub fn test_config(sandbox: &Sandbox, conf: &Path) -> Result<String, String> {
    let out = run(sandbox.nginx(&[
        "-e".as_ref(),
        "stderr".as_ref(),
        "-t".as_ref(),
        "-c".as_ref(),
        conf.as_os_str(),
    ]));
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    let accepted = out.status.success()
        && report.contains("syntax is ok")
        && report.contains("test is successful");
    if accepted {
        Ok(report)
    } else {
        Err(report)
    }
}

fn run(mut command: Command) -> std::process::Output {
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running bwrap: {e}: run scripts/install-test-deps.sh"))
}

/// The configuration of a static file server: the files under `root` served at `addr`, temporary
/// files under `tmp`, no access log. An origin, or a backend.
pub fn static_server_config(root: &Path, tmp: &Path, addr: &str) -> String {
    let tmp = tmp.display();
    format!(
        "pid {tmp}/static-{addr}.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  \
         client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;\n  \
         uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;\n  \
         server {{ listen {addr}; root {}; }}\n}}\n",
        root.display()
    )
}

/// A running nginx, in its sandbox; stopped gracefully (SIGQUIT) when dropped.
pub struct Nginx {
    name: String,
    /// bubblewrap, whose exit is nginx's.
    bwrap: Child,
    /// The pid of the sandbox's command, to signal it: nginx's (its master's, if it has one), or
    /// that of an entrypoint that runs nginx and passes signals on.
    pid: u32,
    /// Where its standard error goes: its error log under `-e stderr`.
    log: PathBuf,
}

impl Nginx {
    /// Writes `conf` to `dir/NAME.conf` and runs it in one process (no master, no daemon) with
    /// its error log in `dir/NAME.log`, `dir` shared into the sandbox if it is not yet; returns
    /// once something accepts connections on `addr`.
    pub fn start(sandbox: &Sandbox, name: &str, conf: &str, dir: &Path, addr: &str) -> Nginx {
        let file = dir.join(format!("{name}.conf"));
        std::fs::write(&file, conf).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
        let sandbox = if sandbox.shares(dir) {
            sandbox.clone()
        } else {
            sandbox.clone().share(dir)
        };
        let command = sandbox.nginx(&[
            "-e".as_ref(),
            "stderr".as_ref(),
            "-c".as_ref(),
            file.as_os_str(),
            "-g".as_ref(),
            "daemon off; master_process off;".as_ref(),
        ]);
        let nginx = Nginx::spawn(name, command, &dir.join(format!("{name}.log")));
        nginx.wait_listening(addr, conf);
        nginx
    }

    /// Spawns `command` (a [`Sandbox::command`]) with its standard error in `log`.
    pub fn spawn(name: &str, command: Command, log: &Path) -> Nginx {
        Nginx::spawn_with_stdout(name, command, log, Stdio::null())
    }

    /// [`Nginx::spawn`], its standard output going to `stdout`: where the generated
    /// configurations' access log (`/dev/stdout`) goes, as a container runtime keeps it.
    pub fn spawn_logging(name: &str, command: Command, log: &Path, stdout: &Path) -> Nginx {
        let file = std::fs::File::create(stdout)
            .unwrap_or_else(|e| panic!("creating {}: {e}", stdout.display()));
        Nginx::spawn_with_stdout(name, command, log, file.into())
    }

    fn spawn_with_stdout(name: &str, mut command: Command, log: &Path, stdout: Stdio) -> Nginx {
        let stderr = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        // A container runtime starts a pod's process with every signal at its default action. The
        // tests' parent may ignore some (a shell's background job ignores SIGINT and SIGQUIT), and
        // an ignored signal is inherited across exec and cannot be trapped by a shell: the
        // entrypoint would never see its stop signal. Start from the defaults, as in a pod.
        // SAFETY: between fork and exec, only async-signal-safe calls (sigaction via signal).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                for signal in [
                    libc::SIGHUP,
                    libc::SIGINT,
                    libc::SIGQUIT,
                    libc::SIGTERM,
                    libc::SIGPIPE,
                ] {
                    if libc::signal(signal, libc::SIG_DFL) == libc::SIG_ERR {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut bwrap = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting bwrap: {e}: run scripts/install-test-deps.sh"));
        // bwrap → the sandbox's init (bwrap) → the command.
        let deadline = Instant::now() + PATIENCE;
        let pid = loop {
            if let Some(pid) = only_child(bwrap.id()).and_then(only_child) {
                break pid;
            }
            if let Ok(Some(status)) = bwrap.try_wait() {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!("nginx {name} did not start: bwrap exited ({status})\n{log}");
            }
            assert!(Instant::now() < deadline, "nginx {name} did not start");
            std::thread::sleep(Duration::from_millis(5));
        };
        Nginx {
            name: name.into(),
            bwrap,
            pid,
            log: log.into(),
        }
    }

    /// Waits until something accepts connections on `addr`; panics with its log (and `context`,
    /// e.g. its configuration) if nginx exits first or does not listen within 10 s.
    pub fn wait_listening(&self, addr: &str, context: &str) {
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect(addr).is_err() {
            if !self.running() {
                panic!("nginx {} exited\n{}\n{context}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nginx {} did not listen on {addr}\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it wrote to its standard error so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Freezes it (SIGSTOP), as a hung process: the kernel still accepts connections on its
    /// sockets, nothing answers them.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets it run again after [`Nginx::pause`] (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Sends `signal` to the sandbox's command, nginx or the entrypoint that runs it, as the
    /// kubelet signals a container's process; panics if it is gone.
    pub fn signal(&self, signal: crate::Signal) {
        assert!(
            self.running(),
            "nginx {} has exited\n{}",
            self.name,
            self.log()
        );
        // SAFETY: kill(2) has no memory effects. While bwrap runs, the pid is nginx's or a
        // zombie of it that the sandbox's init has not reaped yet.
        let sent = unsafe { libc::kill(self.pid as libc::pid_t, signal) };
        assert_eq!(
            sent, 0,
            "signal {signal} to nginx {} ({})",
            self.name, self.pid
        );
    }

    /// Sends `signal` to every process of its sandbox but the sandbox's init: nginx (or the
    /// entrypoint that runs it), its master's workers and anything else it started, parents
    /// before children. SIGSTOP so freezes all of it, as a hung pod; SIGCONT thaws it.
    pub fn signal_all(&self, signal: crate::Signal) {
        assert!(
            self.running(),
            "nginx {} has exited\n{}",
            self.name,
            self.log()
        );
        let mut pending = vec![self.pid];
        while let Some(pid) = pending.pop() {
            // SAFETY: as in `signal`; a process that has exited meanwhile is skipped.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
            pending.extend(children(pid));
        }
    }

    /// The processes of its sandbox but the sandbox's init, parents before children: pid and
    /// command line. An nginx master names itself `nginx: master process …`, its workers
    /// `nginx: worker process`.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let mut processes = Vec::new();
        let mut pending = vec![self.pid];
        while let Some(pid) = pending.pop() {
            // A process that has exited meanwhile is skipped.
            if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                processes.push((pid, cmdline.trim().to_string()));
            }
            pending.extend(children(pid));
        }
        processes
    }

    fn running(&self) -> bool {
        // Without reaping: `Child::try_wait` needs `&mut`, and the pid must stay bwrap's.
        std::fs::read_to_string(format!("/proc/{}/stat", self.bwrap.id()))
            .is_ok_and(|stat| !stat.rsplit(") ").next().unwrap_or("").starts_with('Z'))
    }

    /// Waits up to `within` for the sandbox's command to exit (after [`Nginx::signal`]): its exit
    /// status (bubblewrap's, which is the command's), or `None` while it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while self.running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.bwrap.wait().ok()
    }

    /// Ends it at once (SIGKILL), as a crash does; returns its log.
    pub fn kill(mut self) -> String {
        self.end(libc::SIGKILL);
        self.log()
    }

    /// Stops it gracefully (SIGQUIT: in-flight requests end first), killing it if it takes
    /// more than 10 s; returns its log.
    pub fn stop(mut self) -> String {
        self.end(libc::SIGQUIT);
        self.log()
    }

    /// Sends `signal` to nginx and waits for the sandbox to end with it (bwrap exits when its
    /// command does), killing bwrap, and so the sandbox's init and all in it, after 10 s.
    fn end(&mut self, signal: libc::c_int) {
        // Not once bwrap is reaped: its pid and nginx's may be another process's by now.
        if matches!(self.bwrap.try_wait(), Ok(None)) && self.running() {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(self.pid as libc::pid_t, signal) };
            let deadline = Instant::now() + PATIENCE;
            while self.running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.bwrap.kill();
        let _ = self.bwrap.wait();
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.end(libc::SIGQUIT);
    }
}

/// The one child of process `pid`, once it has one.
fn only_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// The children of every thread of process `pid` (none once it is gone).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    children
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nginx_is_the_release_the_pods_run() {
        let version = version(&Sandbox::new());
        assert!(
            version.contains(VERSION_PREFIX),
            "{version}: the tests must run nginx {VERSION_PREFIX}x"
        );
        // Built with the modules the generated configurations use.
        let out = run(Sandbox::new().nginx(&["-V"]));
        let build = String::from_utf8_lossy(&out.stderr);
        for module in ["slice", "realip", "stub_status", "ssl", "v2"] {
            let flag = format!("--with-http_{module}_module");
            assert!(build.contains(&flag), "no {flag}:\n{build}");
        }
        // njs, the verifier of signed URLs, loaded as the default image loads it.
        let njs = root().join("usr/lib/nginx/modules/ngx_http_js_module.so");
        assert!(
            njs.is_file(),
            "no {}: scripts/install-test-deps.sh makes the root again with libnginx-mod-http-js",
            njs.display()
        );
    }
}
