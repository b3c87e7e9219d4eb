//! Clock faults on the kit's servers: a [`FakeClock`] that a running server reads its
//! time from, moved at run time by the test (a jump forward or back, a clock that runs
//! fast), as TESTING.md's "server wall clock jump" fault.
//!
//! # How
//!
//! A server started under a clock (`MemcachedServer::start_with_clock`,
//! `RedisServer::start_with_clock`, `PostgresServer::start_with_clock`,
//! `EtcdCluster::start_with_clock`, `ZooKeeper::start_with_clock`) runs with a time
//! library preloaded (`LD_PRELOAD`) that reads the clock's control file — one line in
//! libfaketime's syntax, `+<offset seconds> x<rate>` — on every time call (no cache), so a
//! change is seen by the next call. A process whose clock started at real time `S` sees
//!
//! ```text
//! fake(t) = S + offset + (t − S) × rate
//! ```
//!
//! which is `t + offset` at rate 1. The clock keeps that continuous across rate changes
//! (it moves the offset so that the process's time does not step, see
//! [`run_fast`](FakeClock::run_fast)) and across restarts of the server.
//!
//! Two libraries, [`Interposer`]:
//! * **libfaketime** (Debian's `faketime` package, `libfaketimeMT.so.1`), for memcached,
//!   PostgreSQL, etcd and ZooKeeper. It also scales sleeps and poll/epoll timeouts by the
//!   rate.
//! * **the kit's shim** for `redis-server`: Debian's build links jemalloc, and libfaketime
//!   deadlocks there at start (libgpg-error's constructor runs before libfaketime's and
//!   mallocs; jemalloc initialises and calls `clock_gettime`; libfaketime initialises
//!   inside that call, its `dlsym` of a symbol glibc lacks (`__ftime`) mallocs an error
//!   message, and jemalloc waits for a lock its outer call holds — seen in gdb). Tried,
//!   all still hung at start: `FAKETIME_DONT_FAKE_MONOTONIC=1`, libfaketimeMT,
//!   `FAKETIME_FORCE_MONOTONIC_FIX=0`, `LD_PRELOAD` with jemalloc or libgpg-error before
//!   libfaketime, `GLIBC_TUNABLES=glibc.rtld.dynamic_sort=1`, three `MALLOC_CONF`s and the
//!   `faketime` command; preloading glibc (its malloc ahead of jemalloc's) segfaults; a
//!   time namespace (`unshare --time --monotonic`) starts fine but cannot move the wall
//!   clock that expiry uses, nor move anything after the start. The shim (the C source
//!   [`SHIM_SOURCE`], built once with `cc` into the temp directory) never mallocs or
//!   calls `dlsym`: it takes the real time from the `clock_gettime` system call and fakes
//!   `clock_gettime`, `gettimeofday`, `time` and `timespec_get` by the same file and
//!   formula (it `stat`s the file on every call and re-reads it when it was replaced;
//!   it keeps its own copy of the file's name, as redis overwrites its environment for
//!   its process title). It does not scale sleeps.
//!
//! # Which clocks: [`ClockScope`]
//!
//! * [`ClockScope::Wall`] moves `CLOCK_REALTIME` only (`FAKETIME_DONT_FAKE_MONOTONIC=1`):
//!   what an NTP step or an operator's `date -s` does to a real machine. Programs that time
//!   by the monotonic clock do not notice.
//! * [`ClockScope::WallAndMonotonic`] moves the monotonic clocks too (`CLOCK_MONOTONIC`,
//!   `_RAW`, `_COARSE`, `BOOTTIME`): a machine whose oscillator runs fast, or a VM whose
//!   clock is wrong. A backward jump then makes `CLOCK_MONOTONIC` go backwards, which no
//!   real kernel does; libfaketime also reports the monotonic clock on the wall clock's
//!   scale (`S_real + offset + (mono − S_mono) × rate`), the shim on its own.
//!
//! # What reaches whom (measured by `tests/it/clock.rs`)
//!
//! * redis-server: key expiry runs on the wall clock (`mstime()`): +20 s removes a key
//!   with 10 s left at once, −20 s turns its PTTL into 30 s, 5× leaves about 2 s of 10
//!   after 1.6 s.
//! * memcached: its clock ticks once a second from `CLOCK_MONOTONIC`, so a wall-only jump
//!   or fast wall clock changes nothing (a restarted server takes its start time from the
//!   wall clock, though). With the monotonic clock, +20 s expires keys at the next tick,
//!   4× ends an 8 s key after about 2 s, and −20 s stops memcached's clock (libevent's
//!   one-second timer waits for the monotonic time to come back) for as long as the jump.
//! * PostgreSQL: `clock_timestamp()` (and so dlock's lease expiry) and `now()` follow the
//!   wall clock.
//! * etcd: **not reachable**. libfaketime is loaded, but Go reads the clocks through the
//!   vDSO, not libc: leases count down in real seconds through jumps and a fast clock
//!   (the constructor exists to show that). A time namespace offsets only the monotonic
//!   clocks and only before the first process enters it, and lease expiry is relative to
//!   the leader's own clock anyway.
//! * ZooKeeper (Java, which starts and runs under libfaketime in both scopes):
//!   `System.currentTimeMillis` follows the clock (a session's `est` in `cons`), and with
//!   the monotonic clock `System.nanoTime`, by which sessions expire: +20 s expires every
//!   session, 8× expires a 2 s session that dlock renews every 0.44 s, −6 s keeps a
//!   cut-off 2 s session for about 8 s. The wall clock alone leaves sessions alone.
//!
//! # Several processes
//!
//! Jumps are the same for every process under a clock. Rates are not: a process started
//! at another time has another `S`, and a rate change is made continuous for the latest
//! process started under the clock only; a process started later takes the clock's time
//! then. A server's restart is such a start. PostgreSQL's backends are forked from its
//! postmaster and share its `S`. The members of an etcd cluster or ZooKeeper ensemble
//! started under one clock share it: jump it freely, but a rate change steps every member
//! but the latest-started by `(rate change) × (start difference)`.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Environment variable naming the libfaketime library to preload (default: Debian's
/// `libfaketimeMT.so.1`, from the `faketime` package).
pub const LIBFAKETIME_ENV: &str = "DLOCK_LIBFAKETIME";

/// Environment variable naming the C compiler that builds the shim (default: `cc`).
pub const CC_ENV: &str = "CC";

/// Which clocks a [`FakeClock`] moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockScope {
    /// `CLOCK_REALTIME` only: a wall clock stepped by NTP or by hand. The monotonic
    /// clocks stay real.
    Wall,
    /// The wall clock and the monotonic clocks: a machine (or VM) whose time itself is
    /// wrong, e.g. an oscillator that runs fast.
    WallAndMonotonic,
}

/// Which preloaded library fakes a process's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interposer {
    /// Debian's libfaketime (`libfaketimeMT.so.1`, package `faketime`; or
    /// `$DLOCK_LIBFAKETIME`).
    Libfaketime,
    /// The kit's own small shim, for programs linked with jemalloc (`redis-server`),
    /// built with `cc` on first use.
    Shim,
}

/// A clock for servers: a control file their preloaded time library reads on every time
/// call. Cloning is cheap; clones are the same clock. The control file's directory is
/// removed when the last clone is dropped (servers hold a clone).
#[derive(Debug, Clone)]
pub struct FakeClock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    file: PathBuf,
    scope: ClockScope,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Seconds, as written to the file.
    offset: f64,
    /// As written to the file.
    rate: f64,
    /// Real time (seconds since the epoch) the latest process under this clock started.
    epoch: f64,
    writes: u64,
}

impl State {
    /// Fake minus real time, in seconds, for a process that started at `epoch`.
    fn skew(&self, now: f64) -> f64 {
        self.offset + (self.rate - 1.0) * (now - self.epoch)
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl FakeClock {
    /// A clock that moves the clocks of `scope`, at the real time for now (offset 0,
    /// rate 1). It needs no library yet: starting a server under it does.
    ///
    /// # Errors
    /// The control file could not be written.
    pub fn new(scope: ClockScope) -> io::Result<FakeClock> {
        use std::os::unix::fs::PermissionsExt;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dlock-clock-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        // Readable by every user: PostgreSQL runs as `postgres`.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let clock = FakeClock {
            inner: Arc::new(Inner {
                file: dir.join("faketimerc"),
                dir,
                scope,
                state: Mutex::new(State {
                    offset: 0.0,
                    rate: 1.0,
                    epoch: now_secs(),
                    writes: 0,
                }),
            }),
        };
        clock.update(|_, _| {})?;
        Ok(clock)
    }

    /// A clock that moves the wall clock only ([`ClockScope::Wall`]).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn wall() -> io::Result<FakeClock> {
        FakeClock::new(ClockScope::Wall)
    }

    /// A clock that moves the wall and the monotonic clocks
    /// ([`ClockScope::WallAndMonotonic`]).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn wall_and_monotonic() -> io::Result<FakeClock> {
        FakeClock::new(ClockScope::WallAndMonotonic)
    }

    /// Which clocks it moves.
    pub fn scope(&self) -> ClockScope {
        self.inner.scope
    }

    /// The control file (libfaketime's `FAKETIME_TIMESTAMP_FILE`).
    pub fn control_file(&self) -> &Path {
        &self.inner.file
    }

    /// Steps the clock forward by `by` (offsets add up: two jumps of 5 s are one of 10 s).
    ///
    /// # Errors
    /// The control file could not be written.
    pub fn jump_forward(&self, by: Duration) -> io::Result<()> {
        self.update(|s, _| s.offset += by.as_secs_f64())
    }

    /// Steps the clock back by `by`.
    ///
    /// # Errors
    /// The control file could not be written.
    pub fn jump_backward(&self, by: Duration) -> io::Result<()> {
        self.update(|s, _| s.offset -= by.as_secs_f64())
    }

    /// Makes the clock run `rate` times as fast as the real one from now on (`2.0`: two
    /// seconds per second; below 1 it runs slow), without a step: the offset moves so that
    /// the latest process's time is continuous (libfaketime alone would step it by
    /// `(rate change) × (time since the process started)`).
    ///
    /// # Errors
    /// `InvalidInput` for a rate that is not a positive finite number; the control file
    /// could not be written.
    pub fn run_fast(&self, rate: f64) -> io::Result<()> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("clock rate {rate} is not a positive number"),
            ));
        }
        self.update(|s, now| {
            s.offset += (s.rate - rate) * (now - s.epoch);
            s.rate = rate;
        })
    }

    /// Back to the real time at the real rate (a step by minus the current
    /// [`skew`](Self::skew_secs)).
    ///
    /// # Errors
    /// The control file could not be written.
    pub fn reset(&self) -> io::Result<()> {
        self.update(|s, _| {
            s.offset = 0.0;
            s.rate = 1.0;
        })
    }

    /// How far the (latest) process's clock is ahead of the real one now, in seconds
    /// (negative: behind).
    pub fn skew_secs(&self) -> f64 {
        self.state().skew(now_secs())
    }

    /// The rate (1.0: real speed).
    pub fn rate(&self) -> f64 {
        self.state().rate
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `change` to the state and writes the control file atomically (a reader
    /// never sees a half-written file: libfaketime exits on one it cannot parse).
    fn update(&self, change: impl FnOnce(&mut State, f64)) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut state = self.state();
        change(&mut state, now_secs());
        state.writes += 1;
        let tmp = self.inner.dir.join(format!("faketimerc.{}", state.writes));
        std::fs::write(&tmp, format!("{:+.9} x{:.9}\n", state.offset, state.rate))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &self.inner.file)
    }

    /// Marks the start of a new process under this clock: its `S` is now. At a rate other
    /// than 1 the offset moves so that the new process starts at the clock's current time.
    fn process_starts(&self) -> io::Result<()> {
        let rebase = self.state().rate != 1.0;
        if rebase {
            self.update(|s, now| {
                s.offset = s.skew(now);
                s.epoch = now;
            })
        } else {
            self.state().epoch = now_secs();
            Ok(())
        }
    }

    /// The environment a process needs to run under this clock, as `(name, value)`; call
    /// it right before spawning one process (it marks that process's start). `FAKETIME`
    /// must not be set in the process's environment (it would take precedence over the
    /// file): [`apply`](Self::apply) and [`env_command_args`](Self::env_command_args)
    /// remove it.
    ///
    /// # Errors
    /// The library is missing (libfaketime: install the `faketime` package; the shim:
    /// needs a C compiler), or the control file could not be written.
    pub fn env(&self, interposer: Interposer) -> io::Result<Vec<(String, OsString)>> {
        let library = match interposer {
            Interposer::Libfaketime => libfaketime()?,
            Interposer::Shim => shim()?,
        };
        self.process_starts()?;
        let dont_fake_monotonic = match self.inner.scope {
            ClockScope::Wall => "1",
            ClockScope::WallAndMonotonic => "0",
        };
        Ok(vec![
            ("LD_PRELOAD".into(), library.into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.inner.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            (
                "FAKETIME_DONT_FAKE_MONOTONIC".into(),
                dont_fake_monotonic.into(),
            ),
            // libfaketime reads the offset with atof(): a decimal point, whatever a program
            // that calls setlocale(LC_ALL, "") (the JVM) would otherwise pick.
            ("LC_NUMERIC".into(), "C".into()),
        ])
    }

    /// Sets `command`'s environment to run under this clock (see [`env`](Self::env)).
    ///
    /// # Errors
    /// As [`env`](Self::env).
    pub fn apply(&self, command: &mut Command, interposer: Interposer) -> io::Result<()> {
        command.env_remove("FAKETIME").envs(self.env(interposer)?);
        Ok(())
    }

    /// Arguments for `env(1)` (`-u FAKETIME NAME=value …`) that run the program named
    /// after them under this clock: for a process started through another (`setpriv`, a
    /// shell) that should not itself run under it.
    ///
    /// # Errors
    /// As [`env`](Self::env).
    pub fn env_command_args(&self, interposer: Interposer) -> io::Result<Vec<OsString>> {
        let mut args: Vec<OsString> = vec!["-u".into(), "FAKETIME".into()];
        for (name, value) in self.env(interposer)? {
            let mut arg = OsString::from(name);
            arg.push("=");
            arg.push(value);
            args.push(arg);
        }
        Ok(args)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes what libfaketime leaves in `/dev/shm` for process `pid` when the process is
/// killed (it removes them itself when it exits normally). Harmless for other processes.
pub fn forget_process(pid: u32) {
    let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
    let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
}

/// libfaketime's multithreaded library: `$DLOCK_LIBFAKETIME`, else Debian's.
///
/// # Errors
/// It is not installed.
pub fn libfaketime() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(LIBFAKETIME_ENV) {
        let path = PathBuf::from(path);
        return if path.exists() {
            Ok(path)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{LIBFAKETIME_ENV}={} does not exist", path.display()),
            ))
        };
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .collect();
    candidates.push("/usr/lib/faketime/libfaketimeMT.so.1".into());
    candidates.push("/usr/local/lib/faketime/libfaketimeMT.so.1".into());
    candidates.into_iter().find(|p| p.exists()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "libfaketime not found: install the `faketime` package (apt-get install \
                 faketime), or set {LIBFAKETIME_ENV}"
            ),
        )
    })
}

/// The shim's C source (see the module documentation).
pub const SHIM_SOURCE: &str = r#"/* dlock-test clock shim: fakes CLOCK_REALTIME (and, unless
 * FAKETIME_DONT_FAKE_MONOTONIC=1, the monotonic clocks) of the process it is preloaded
 * into by the offset and rate in $FAKETIME_TIMESTAMP_FILE ("+S.F xR", libfaketime's
 * syntax): fake = S + offset + (t - S) * rate. Every call stats the file and re-reads it
 * when it was replaced (the kit renames a new file into place).
 * Unlike libfaketime it never calls malloc or dlsym, so it can be preloaded into programs
 * linked with jemalloc (redis-server). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t raw_ns(clockid_t id) {
  struct timespec ts;
  if (syscall(SYS_clock_gettime, id, &ts) != 0) return 0;
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int state; /* 0: not started, 1: starting, 2: ready */
static int64_t start_real, start_mono, start_raw, start_boot;
static int fake_mono = 1;
/* A copy: programs may overwrite their environment (redis's setproctitle does). */
static char path[4096];

static void init(void) {
  int expected = 0;
  if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == 2) return;
  if (__atomic_compare_exchange_n(&state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    start_real = raw_ns(CLOCK_REALTIME);
    start_mono = raw_ns(CLOCK_MONOTONIC);
    start_raw = raw_ns(CLOCK_MONOTONIC_RAW);
    start_boot = raw_ns(CLOCK_BOOTTIME);
    const char *file = getenv("FAKETIME_TIMESTAMP_FILE");
    if (file && strlen(file) < sizeof path) strcpy(path, file);
    const char *dont = getenv("FAKETIME_DONT_FAKE_MONOTONIC");
    fake_mono = !(dont && strcmp(dont, "1") == 0);
    __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 2) {
    }
  }
}

__attribute__((constructor)) static void shim_init(void) { init(); }

static const char *number(const char *s, double *out) {
  double v = 0, scale = 0.1;
  int digits = 0;
  while (*s >= '0' && *s <= '9') { v = v * 10 + (*s++ - '0'); digits++; }
  if (*s == '.') {
    s++;
    while (*s >= '0' && *s <= '9') { v += (*s++ - '0') * scale; scale /= 10; digits++; }
  }
  *out = v;
  return digits ? s : NULL;
}

/* "[+-]S[.F] [xR[.F]]" */
static int parse(const char *s, int64_t *off, double *rate) {
  double v, r = 1.0;
  int neg = 0;
  while (*s == ' ') s++;
  if (*s == '+') s++;
  else if (*s == '-') { neg = 1; s++; }
  else return 0;
  if (!(s = number(s, &v))) return 0;
  while (*s == ' ') s++;
  if (*s == 'x' && !number(s + 1, &r)) return 0;
  *off = (int64_t)((neg ? -v : v) * 1e9);
  *rate = r > 0 ? r : 1.0;
  return 1;
}

static uint64_t seq;
static int64_t cur_off;
static uint64_t cur_rate_bits = 0x3ff0000000000000ULL; /* 1.0 */
/* The file last read: inode and modification time. */
static int64_t seen_ino = -1, seen_mtime = -1;
static int refreshing;

static int64_t mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

static void params(int64_t *off, double *rate) {
  struct stat st;
  if (path[0] && stat(path, &st) == 0 &&
      ((int64_t)st.st_ino != __atomic_load_n(&seen_ino, __ATOMIC_ACQUIRE) ||
       mtime_ns(&st) != __atomic_load_n(&seen_mtime, __ATOMIC_ACQUIRE)) &&
      !__atomic_exchange_n(&refreshing, 1, __ATOMIC_ACQUIRE)) {
    char buf[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t n = read(fd, buf, sizeof buf - 1);
      int64_t o;
      double r;
      if (n > 0 && fstat(fd, &st) == 0) {
        buf[n] = 0;
        if (parse(buf, &o, &r)) {
          uint64_t bits;
          memcpy(&bits, &r, sizeof bits);
          __atomic_fetch_add(&seq, 1, __ATOMIC_ACQ_REL);
          __atomic_store_n(&cur_off, o, __ATOMIC_RELAXED);
          __atomic_store_n(&cur_rate_bits, bits, __ATOMIC_RELAXED);
          __atomic_fetch_add(&seq, 1, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&seen_ino, (int64_t)st.st_ino, __ATOMIC_RELEASE);
        __atomic_store_n(&seen_mtime, mtime_ns(&st), __ATOMIC_RELEASE);
      }
      close(fd);
    }
    __atomic_store_n(&refreshing, 0, __ATOMIC_RELEASE);
  }
  for (;;) {
    uint64_t s1 = __atomic_load_n(&seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) continue;
    int64_t o = __atomic_load_n(&cur_off, __ATOMIC_RELAXED);
    uint64_t bits = __atomic_load_n(&cur_rate_bits, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&seq, __ATOMIC_RELAXED) == s1) {
      *off = o;
      memcpy(rate, &bits, sizeof *rate);
      return;
    }
  }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  init();
  int64_t start;
  int fake = 1;
  switch (id) {
  case CLOCK_REALTIME:
  case CLOCK_REALTIME_COARSE:
    start = start_real;
    break;
  case CLOCK_MONOTONIC:
  case CLOCK_MONOTONIC_COARSE:
    start = start_mono;
    fake = fake_mono;
    break;
  case CLOCK_MONOTONIC_RAW:
    start = start_raw;
    fake = fake_mono;
    break;
  case CLOCK_BOOTTIME:
    start = start_boot;
    fake = fake_mono;
    break;
  default:
    return syscall(SYS_clock_gettime, id, ts);
  }
  if (syscall(SYS_clock_gettime, id, ts) != 0) return -1;
  if (!fake) return 0;
  int64_t off, now = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec;
  double rate;
  params(&off, &rate);
  int64_t ns = rate == 1.0 ? now + off
                           : start + off + (int64_t)((double)(now - start) * rate);
  ts->tv_sec = ns / 1000000000LL;
  ts->tv_nsec = ns % 1000000000LL;
  if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec -= 1; }
  return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
  struct timespec ts;
  if (tz) memset(tz, 0, 2 * sizeof(int));
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
  tv->tv_sec = ts.tv_sec;
  tv->tv_usec = ts.tv_nsec / 1000;
  return 0;
}

time_t time(time_t *t) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
  if (t) *t = ts.tv_sec;
  return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
  if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0) return 0;
  return base;
}
"#;

/// The kit's shim, built once per machine and source (`cc -shared`) into the temp
/// directory.
///
/// # Errors
/// No C compiler, or it failed.
pub fn shim() -> io::Result<PathBuf> {
    static SHIM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = SHIM.get_or_init(|| build_shim().map_err(|e| e.to_string()));
    built.clone().map_err(io::Error::other)
}

fn build_shim() -> io::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::PermissionsExt;
    let mut hasher = std::hash::DefaultHasher::new();
    SHIM_SOURCE.hash(&mut hasher);
    let dir = std::env::temp_dir().join(format!("dlock-clock-shim-{:016x}", hasher.finish()));
    let library = dir.join("libdlockclock.so");
    if library.exists() {
        return Ok(library);
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let pid = std::process::id();
    let source = dir.join(format!("shim.{pid}.c"));
    let partial = dir.join(format!("libdlockclock.so.{pid}"));
    std::fs::write(&source, SHIM_SOURCE)?;
    let cc = std::env::var(CC_ENV).unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&partial)
        .arg(&source)
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the clock shim for redis-server needs a C compiler ({cc}): {e}"),
            )
        })?;
    let _ = std::fs::remove_file(&source);
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cc} could not build the clock shim: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    // Atomic: a concurrent test process sees no library or a whole one.
    std::fs::rename(&partial, &library)?;
    Ok(library)
}
