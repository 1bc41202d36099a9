//! Was the machine quiet while `bench` timed? On a virtual machine the hypervisor runs other
//! guests on the same cores and takes their time from ours ("steal": the guest's CPU was
//! ready to run and was not given one); other processes of this machine take theirs too.
//! Either makes a wall-clock timing slower than the code, by an amount the timing alone
//! cannot show — a two-thread step loses most, as each of its waits for the other thread
//! becomes a wait for a core. So every timed phase of `bench` reads the machine's CPU
//! counters before and after, and the report says what share of the time went elsewhere.

/// One reading of the machine's CPU time (`/proc/stat`'s `cpu` line: every core together,
/// in clock ticks) and of this process's own (`/proc/self/stat`: its threads and the
/// children it has waited for, such as `bench --pytorch`'s Python).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostClock {
    /// user + nice + system + irq + softirq (guest time is inside user).
    busy: u64,
    /// idle + iowait.
    idle: u64,
    /// Ticks a core of this machine was ready to run and the hypervisor ran someone else.
    steal: u64,
    /// This process's user + system time and its waited-for children's.
    ours: u64,
}

/// Where a phase's CPU time went, as shares of every core's time over the phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLoad {
    /// Taken by the hypervisor (steal).
    pub steal: f64,
    /// Used by other processes of this machine.
    pub others: f64,
    /// The phase's length in clock ticks, every core counted (the shares' resolution is one
    /// tick: 10 ms of one core where the kernel counts 100 a second).
    pub ticks: u64,
}

/// The share of steal above which a report calls its timings unreliable.
pub const QUIET_STEAL: f64 = 0.05;

/// The share of other processes' time above which a report calls its timings unreliable
/// (higher: the kernel's own threads show here — page zeroing for a fresh process's heap
/// reads as 2–6 % of a 1 s phase —, and another benchmark or a build reads as 25 % or more).
pub const QUIET_OTHERS: f64 = 0.10;

/// Phases shorter than this (ticks, every core) say nothing: one tick is already ≥ 5 %.
const MIN_TICKS: u64 = 20;

impl HostClock {
    /// The counters now; `None` where the system does not expose them (not Linux).
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(&stat, &own)
    }

    /// The counters from the texts of `/proc/stat` and `/proc/self/stat`.
    fn parse(stat: &str, own: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        if f.len() < 4 {
            return None;
        }
        // After the command's closing parenthesis (which may itself hold spaces and
        // parentheses): field 3 (state) is the first, so utime (14) is the 12th.
        let rest = &own[own.rfind(')')? + 1..];
        let p: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if p.len() < 4 {
            return None;
        }
        Some(Self {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            idle: at(3) + at(4),
            steal: at(7),
            ours: p.iter().sum(),
        })
    }

    /// What the machine's time went to between `self` and `later`; `None` where the phase was
    /// too short to tell (fewer than [`MIN_TICKS`]).
    pub fn until(self, later: Self) -> Option<HostLoad> {
        let busy = later.busy.saturating_sub(self.busy);
        let steal = later.steal.saturating_sub(self.steal);
        let ticks = busy + later.idle.saturating_sub(self.idle) + steal;
        if ticks < MIN_TICKS {
            return None;
        }
        let ours = later.ours.saturating_sub(self.ours);
        Some(HostLoad {
            steal: steal as f64 / ticks as f64,
            others: busy.saturating_sub(ours) as f64 / ticks as f64,
            ticks,
        })
    }
}

/// Runs `f` and says where the machine's time went meanwhile (`None`: not measurable here).
pub fn measured<T>(f: impl FnOnce() -> T) -> (T, Option<HostLoad>) {
    let before = HostClock::now();
    let value = f();
    let load = before.zip(HostClock::now()).and_then(|(a, b)| a.until(b));
    (value, load)
}

impl HostLoad {
    /// Whether neither the hypervisor nor other processes took more than their share
    /// ([`QUIET_STEAL`], [`QUIET_OTHERS`]).
    pub fn quiet(&self) -> bool {
        self.steal <= QUIET_STEAL && self.others <= QUIET_OTHERS
    }

    /// The report's JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "steal_share": self.steal,
            "others_share": self.others,
            "ticks": self.ticks,
            "quiet": self.quiet(),
        })
    }

    /// Back from [`HostLoad::json`].
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        Some(Self {
            steal: v["steal_share"].as_f64()?,
            others: v["others_share"].as_f64()?,
            ticks: v["ticks"].as_u64()?,
        })
    }

    /// A short phrase: `steal 31.0 %, other processes 0.4 % (NOT QUIET)`.
    pub fn phrase(&self) -> String {
        format!(
            "steal {:.1} %, other processes {:.1} %{}",
            100.0 * self.steal,
            100.0 * self.others,
            if self.quiet() { "" } else { " (NOT QUIET)" }
        )
    }
}

/// `{phase: load}` for a report (`null` where a phase was not measured).
pub fn phases_json(phases: &[(&str, Option<HostLoad>)]) -> serde_json::Value {
    let map = phases
        .iter()
        .map(|(k, l)| {
            (
                k.to_string(),
                l.map_or(serde_json::Value::Null, |l| l.json()),
            )
        })
        .collect();
    serde_json::Value::Object(map)
}

/// `bench`'s lines on the machine's other work during each phase of `load` (the report's
/// `host_load`: phase name → [`HostLoad::json`] or null); none where nothing was measured.
pub fn report_lines(load: &serde_json::Value, phases: &[(&str, &str)]) -> Vec<String> {
    let measured: Vec<(&str, HostLoad)> = phases
        .iter()
        .filter_map(|&(key, name)| Some((name, HostLoad::from_json(&load[key])?)))
        .collect();
    if measured.is_empty() {
        return Vec::new();
    }
    let list: Vec<String> = measured
        .iter()
        .map(|(name, l)| format!("{name}: {}", l.phrase()))
        .collect();
    let mut lines = vec![format!(
        "  the machine meanwhile (shares of every core's time; steal: taken by the hypervisor): {}",
        list.join(" · ")
    )];
    if measured.iter().any(|(_, l)| !l.quiet()) {
        lines.push(format!(
            "  NOT QUIET: with steal above {:.0} % or other processes above {:.0} % the times include waits for a core, not just this code's; rerun on a quiet machine to compare",
            100.0 * QUIET_STEAL,
            100.0 * QUIET_OTHERS
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &str = "4242 (grpo lab (x)) R 1 2 3 4 5 6 7 8 9 10 100 20 30 5 20 0 1 0";

    fn stat(user: u64, idle: u64, steal: u64) -> String {
        format!("cpu  {user} 0 10 {idle} 5 0 2 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n")
    }

    #[test]
    fn parses_the_machine_and_this_process() {
        let c = HostClock::parse(&stat(1000, 500, 70), OWN).unwrap();
        assert_eq!(c.busy, 1000 + 10 + 2);
        assert_eq!(c.idle, 505);
        assert_eq!(c.steal, 70);
        // utime 100 + stime 20 + cutime 30 + cstime 5, past a name with spaces and ')'.
        assert_eq!(c.ours, 155);
        assert!(HostClock::parse("intr 1\n", OWN).is_none());
        assert!(HostClock::parse(&stat(1, 1, 1), "4242 (x) R 1").is_none());
    }

    #[test]
    fn shares_of_steal_and_of_other_processes() {
        let a = HostClock::parse(&stat(1000, 500, 70), OWN).unwrap();
        // 100 ticks: 40 busy (30 ours), 30 idle, 30 stolen.
        let own = "4242 (grpo lab (x)) R 1 2 3 4 5 6 7 8 9 10 120 30 35 0 20 0 1 0";
        let b = HostClock::parse(&stat(1040, 530, 100), own).unwrap();
        let l = a.until(b).unwrap();
        assert_eq!(l.ticks, 100);
        assert!((l.steal - 0.30).abs() < 1e-12, "{l:?}");
        assert!((l.others - 0.10).abs() < 1e-12, "{l:?}");
        assert!(!l.quiet());
        assert!(l.phrase().contains("NOT QUIET"), "{}", l.phrase());
        assert_eq!(HostLoad::from_json(&l.json()), Some(l));
        let load = phases_json(&[("timed", Some(l)), ("burn", None)]);
        assert_eq!(load, serde_json::json!({ "timed": l.json(), "burn": null }));
        let lines = report_lines(&load, &[("timed", "timed steps"), ("burn", "burn's path")]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("timed steps: steal 30.0 %, other processes 10.0 % (NOT QUIET)"));
        assert!(!lines[0].contains("burn"), "{lines:?}");
        assert!(report_lines(&serde_json::json!({ "timed": null }), &[("timed", "t")]).is_empty());
        // Too short a phase says nothing.
        let c = HostClock::parse(&stat(1005, 505, 71), OWN).unwrap();
        assert!(a.until(c).is_none());
        // Quiet: all of the busy time ours, no steal.
        let own = "4242 (grpo lab (x)) R 1 2 3 4 5 6 7 8 9 10 140 20 30 5 20 0 1 0";
        let d = HostClock::parse(&stat(1040, 560, 70), own).unwrap();
        let q = a.until(d).unwrap();
        assert!(q.quiet() && q.steal == 0.0 && q.others == 0.0, "{q:?}");
        assert!(!q.phrase().contains("NOT QUIET"));
        let load = serde_json::json!({ "timed": q.json() });
        assert_eq!(report_lines(&load, &[("timed", "timed steps")]).len(), 1);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_loop_counts_as_this_process_s_time() {
        // 0.5 s of this thread's work is ~50 ticks of its own time (100 a second), fewer where
        // the hypervisor takes some of it.
        let a = HostClock::now().expect("Linux has /proc/stat and /proc/self/stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 500 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let b = HostClock::now().unwrap();
        assert!(b.ours >= a.ours + 10, "{a:?} → {b:?}");
        let l = a.until(b).expect("0.5 s of every core is ≥ 20 ticks");
        assert!((0.0..=1.0).contains(&l.steal) && (0.0..=1.0).contains(&l.others));
    }
}
