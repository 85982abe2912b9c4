//! A fault-injecting wrapper around any medium: frames the inner medium
//! receives are dropped, duplicated, bit-corrupted, delayed or reordered at
//! configured rates, from a seeded random source, so a run is repeatable for
//! the same input. Faults apply on the receive side, so a waiter never
//! sleeps past the moment a held-back frame is due.

use crate::{Addr, Caps, GatherFrame, Medium, MediumStats, OutFrame, Placed, Placement, RecvBatch};
use std::io;
use std::os::fd::RawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Rates (each in 0..=1) and times of the faults to inject.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    /// Chance a frame is dropped.
    pub loss: f64,
    /// Chance a frame arrives twice.
    pub dup: f64,
    /// Chance a frame is held back so that later ones overtake it.
    pub reorder: f64,
    /// Extra time every frame is held.
    pub delay: Duration,
    /// Chance one bit of a frame is flipped.
    pub corrupt: f64,
    pub seed: u64,
}

impl Default for FaultSpec {
    fn default() -> FaultSpec {
        FaultSpec {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            delay: Duration::ZERO,
            corrupt: 0.0,
            seed: 1,
        }
    }
}

/// A fault spec that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultSpecError {
    /// A key other than loss, dup, reorder, delay, corrupt, seed.
    #[error("unknown key {0:?} (known: loss, dup, reorder, delay, corrupt, seed)")]
    UnknownKey(String),
    /// A `key=value` item without `=`.
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    /// A rate that is not a number in 0..=1.
    #[error("{key}={value}: a rate must be a number from 0 to 1")]
    BadRate { key: String, value: String },
    /// A duration without a known unit (ns, us, ms, s).
    #[error("{key}={value}: want a duration such as 100us, 2ms or 1s")]
    BadDuration { key: String, value: String },
    #[error("seed={0}: want a whole number")]
    BadSeed(String),
    /// A duration of an hour or more.
    #[error("{key}={value}: at most an hour")]
    TooLong { key: String, value: String },
    /// A key given twice: which was meant?
    #[error("{0} is given twice")]
    Repeated(String),
}

fn duration(key: &str, v: &str) -> Result<Duration, FaultSpecError> {
    let bad = || FaultSpecError::BadDuration {
        key: key.to_string(),
        value: v.to_string(),
    };
    let (num, scale) = if let Some(n) = v.strip_suffix("ns") {
        (n, 1e-9)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad());
    };
    let x: f64 = num.parse().map_err(|_| bad())?;
    if !(x.is_finite() && x >= 0.0) {
        return Err(bad());
    }
    if x * scale >= 3600.0 {
        return Err(FaultSpecError::TooLong {
            key: key.to_string(),
            value: v.to_string(),
        });
    }
    Ok(Duration::from_secs_f64(x * scale))
}

impl FromStr for FaultSpec {
    type Err = FaultSpecError;

    /// Parses `loss=0.05,dup=0.01,reorder=0.01,delay=100us,corrupt=0.001,seed=7`
    /// (any subset, any order).
    fn from_str(s: &str) -> Result<FaultSpec, FaultSpecError> {
        let mut f = FaultSpec::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| FaultSpecError::NotKeyValue(item.to_string()))?;
            let (k, v) = (k.trim(), v.trim());
            if seen.contains(&k) {
                return Err(FaultSpecError::Repeated(k.to_string()));
            }
            seen.push(k);
            let rate = || -> Result<f64, FaultSpecError> {
                match v.parse::<f64>() {
                    Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
                    _ => Err(FaultSpecError::BadRate {
                        key: k.to_string(),
                        value: v.to_string(),
                    }),
                }
            };
            match k {
                "loss" => f.loss = rate()?,
                "dup" => f.dup = rate()?,
                "reorder" => f.reorder = rate()?,
                "corrupt" => f.corrupt = rate()?,
                "delay" => f.delay = duration(k, v)?,
                "seed" => f.seed = v.parse().map_err(|_| FaultSpecError::BadSeed(v.into()))?,
                _ => return Err(FaultSpecError::UnknownKey(k.to_string())),
            }
        }
        Ok(f)
    }
}

/// splitmix64. Written here rather than taken from a crate: the injector
/// needs a handful of lines of a well-known generator whose sequence must
/// never change between versions, or recorded runs stop repeating.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Counters of the faults applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delayed: u64,
    pub corrupted: u64,
}

struct Held {
    due: Instant,
    from: Addr,
    bytes: Vec<u8>,
}

struct State {
    rng: Rng,
    held: Vec<Held>,
    /// Frames read from the inner medium (taken out while in use).
    scratch: Option<RecvBatch>,
    stats: FaultStats,
}

/// A medium whose received frames suffer the faults of a [`FaultSpec`].
pub struct Inject<M: Medium> {
    inner: M,
    spec: FaultSpec,
    caps: Caps,
    state: Mutex<State>,
    /// Frames handed to the caller.
    passed: AtomicU64,
}

/// How long a reordered frame is held at most, beyond `delay`.
const REORDER_HOLD: Duration = Duration::from_micros(200);

impl<M: Medium> Inject<M> {
    pub fn new(inner: M, spec: FaultSpec) -> Inject<M> {
        let mut caps = inner.caps().clone();
        caps.name = "inject";
        // Corruption happens above the inner medium's checksum.
        caps.intact &= spec.corrupt == 0.0;
        // Every frame passes through the injector's hands.
        caps.lends = false;
        let scratch = RecvBatch::new(caps.max_batch.max(1), 65_536);
        Inject {
            state: Mutex::new(State {
                rng: Rng(spec.seed),
                held: Vec::new(),
                scratch: Some(scratch),
                stats: FaultStats::default(),
            }),
            inner,
            spec,
            caps,
            passed: AtomicU64::new(0),
        }
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }

    pub fn fault_stats(&self) -> FaultStats {
        self.lock().stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The faults for one frame: into `out` now, or held.
    fn apply(&self, st: &mut State, now: Instant, from: Addr, bytes: &[u8], out: &mut RecvBatch) {
        let f = &self.spec;
        if st.rng.chance(f.loss) {
            st.stats.dropped += 1;
            return;
        }
        let copies = if st.rng.chance(f.dup) {
            st.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut hold = f.delay;
            if st.rng.chance(f.reorder) {
                st.stats.reordered += 1;
                hold += Duration::from_nanos(1 + st.rng.below(REORDER_HOLD.as_nanos() as u64));
            }
            let corrupt = st.rng.chance(f.corrupt) && !bytes.is_empty();
            if hold.is_zero() && !corrupt && out.push(from, bytes) {
                continue;
            }
            let mut b = bytes.to_vec();
            if corrupt {
                st.stats.corrupted += 1;
                let bit = st.rng.below(b.len() as u64 * 8);
                b[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            if hold.is_zero() && out.push(from, &b) {
                continue;
            }
            if !f.delay.is_zero() {
                st.stats.delayed += 1;
            }
            st.held.push(Held {
                due: now + hold,
                from,
                bytes: b,
            });
        }
    }
}

impl<M: Medium> Medium for Inject<M> {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn local_addr(&self) -> Addr {
        self.inner.local_addr()
    }

    fn send(&self, frames: &[OutFrame<'_>]) -> io::Result<()> {
        self.inner.send(frames)
    }

    fn send_gathered(&self, frames: &[GatherFrame<'_>]) -> io::Result<()> {
        self.inner.send_gathered(frames)
    }

    fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.clear();
        let mut st = self.lock();
        let now = Instant::now();
        // Held frames that are due go first, earliest first.
        st.held.sort_by_key(|h| h.due);
        let due = st.held.iter().take_while(|h| h.due <= now).count();
        let mut kept = 0;
        for i in 0..due {
            let h = &st.held[i];
            if !batch.push(h.from, &h.bytes) {
                kept = due - i;
                break;
            }
        }
        st.held.drain(..due - kept);
        let Some(mut scratch) = st.scratch.take() else {
            return Ok(batch.len());
        };
        let r = self.inner.recv(&mut scratch);
        if let Ok(n) = r {
            for i in 0..n {
                let (from, bytes) = scratch.frame(i);
                self.apply(&mut st, now, from, bytes, batch);
            }
        }
        scratch.clear();
        st.scratch = Some(scratch);
        r?;
        self.passed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(batch.len())
    }

    /// Where loss is the only fault: the inner medium's placed receive, and
    /// the loss applied to what it found (a frame dropped after placing
    /// leaves junk where the caller expected it, as any other frame may).
    /// Frames held, duplicated or corrupted need the injector's own copy.
    unsafe fn recv_placed(
        &self,
        batch: &mut RecvBatch,
        places: &[Placement],
        expected: &dyn Fn(usize, &[u8], usize) -> bool,
    ) -> io::Result<Placed> {
        let f = &self.spec;
        if f.dup > 0.0 || f.reorder > 0.0 || f.corrupt > 0.0 || !f.delay.is_zero() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        // SAFETY: the caller's promise, passed on.
        let found = unsafe { self.inner.recv_placed(batch, places, expected)? };
        let mut st = self.lock();
        let mut kept = Placed::default();
        let mut i = 0;
        batch.frames.retain(|_| {
            let lose = st.rng.chance(f.loss);
            if !lose {
                if found.in_place(i) && kept.frames < 64 {
                    kept.in_place |= 1 << kept.frames;
                }
                kept.frames += 1;
            }
            i += 1;
            !lose
        });
        st.stats.dropped += (found.frames - kept.frames) as u64;
        self.passed.fetch_add(kept.frames as u64, Ordering::Relaxed);
        Ok(kept)
    }

    fn connect(&self, to: Addr) -> io::Result<()> {
        self.inner.connect(to)
    }

    fn settle(&self) {
        self.inner.settle()
    }

    fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        let next = self.lock().held.iter().map(|h| h.due).min();
        let t = match next {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                Some(timeout.map_or(left, |t| t.min(left)))
            }
            None => timeout,
        };
        self.inner.wait(t)
    }

    fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    fn stats(&self) -> MediumStats {
        let mut s = self.inner.stats();
        s.frames_received = self.passed.load(Ordering::Relaxed);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// An in-memory medium: `recv` hands out whatever was queued.
    struct Fake {
        caps: Caps,
        queue: Mutex<Vec<Vec<u8>>>,
    }

    fn fake(frames: usize) -> Fake {
        Fake {
            caps: Caps {
                name: "fake",
                max_frame: 1500,
                max_batch: 64,
                gso: false,
                gro: false,
                intact: true,
                lends: false,
                gathers: false,
            },
            queue: Mutex::new((0..frames).map(|i| vec![i as u8; 40]).collect()),
        }
    }

    fn here() -> Addr {
        Addr::Ip(SocketAddr::from(([127, 0, 0, 1], 9)))
    }

    impl Medium for Fake {
        fn caps(&self) -> &Caps {
            &self.caps
        }
        fn local_addr(&self) -> Addr {
            here()
        }
        fn send(&self, _: &[OutFrame<'_>]) -> io::Result<()> {
            Ok(())
        }
        fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
            batch.clear();
            let mut q = self.queue.lock().unwrap();
            let n = q.len().min(32);
            for f in q.drain(..n) {
                batch.push(here(), &f);
            }
            Ok(n)
        }
        fn wait(&self, t: Option<Duration>) -> io::Result<()> {
            std::thread::sleep(t.unwrap_or(Duration::ZERO).min(Duration::from_millis(5)));
            Ok(())
        }
        fn fd(&self) -> RawFd {
            -1
        }
    }

    /// Everything that comes out within `limit`.
    fn drain(m: &Inject<Fake>, limit: Duration) -> Vec<Vec<u8>> {
        let mut b = RecvBatch::new(64, 2048);
        let mut out = vec![];
        let start = Instant::now();
        while start.elapsed() < limit {
            m.recv(&mut b).unwrap();
            out.extend(b.iter().map(|(_, f)| f.to_vec()));
            m.wait(Some(Duration::from_millis(1))).unwrap();
        }
        out
    }

    fn spec(s: &str) -> FaultSpec {
        s.parse().unwrap()
    }

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let f = spec("loss=0.05, dup=0.01,reorder=0.02,delay=100us,corrupt=0.001,seed=7");
        assert_eq!(f.loss, 0.05);
        assert_eq!(f.delay, Duration::from_micros(100));
        assert_eq!(f.seed, 7);
        assert_eq!(spec(""), FaultSpec::default());
        let err = |s: &str| s.parse::<FaultSpec>().unwrap_err();
        assert_eq!(err("los=1"), FaultSpecError::UnknownKey("los".into()));
        assert!(matches!(err("loss=1.5"), FaultSpecError::BadRate { .. }));
        assert!(matches!(err("loss=0.05,loss=0.1"), FaultSpecError::Repeated(k) if k == "loss"));
        assert!(matches!(
            err("delay=99999999s"),
            FaultSpecError::TooLong { .. }
        ));
        assert!(matches!(
            err("delay=1h"),
            FaultSpecError::BadDuration { .. }
        ));
        assert!(matches!(err("loss=-0.1"), FaultSpecError::BadRate { .. }));
        assert!(matches!(err("delay=5"), FaultSpecError::BadDuration { .. }));
        assert!(matches!(err("loss"), FaultSpecError::NotKeyValue(_)));
        assert!(matches!(err("seed=x"), FaultSpecError::BadSeed(_)));
        assert!(err("loss=2").to_string().contains("from 0 to 1"));
    }

    #[test]
    fn loss_one_drops_all_and_zero_drops_none() {
        let all = Inject::new(fake(50), spec("loss=1"));
        assert!(drain(&all, Duration::from_millis(20)).is_empty());
        assert_eq!(all.fault_stats().dropped, 50);
        let none = Inject::new(fake(50), spec("loss=0"));
        let got = drain(&none, Duration::from_millis(20));
        assert_eq!(got, (0..50).map(|i| vec![i as u8; 40]).collect::<Vec<_>>());
    }

    #[test]
    fn dup_one_doubles_every_frame() {
        let m = Inject::new(fake(20), spec("dup=1"));
        let got = drain(&m, Duration::from_millis(20));
        assert_eq!(got.len(), 40);
        for i in 0..20 {
            assert_eq!(got.iter().filter(|f| f[0] == i as u8).count(), 2);
        }
    }

    #[test]
    fn corruption_flips_one_bit_and_keeps_the_length() {
        let m = Inject::new(fake(30), spec("corrupt=1,seed=3"));
        let got = drain(&m, Duration::from_millis(20));
        assert_eq!(got.len(), 30);
        for f in &got {
            assert_eq!(f.len(), 40);
            let i = f.iter().map(|&b| b as usize).max().unwrap_or(0);
            let want = vec![f[0]; 40];
            let flipped: u32 = f.iter().zip(&want).map(|(a, b)| (a ^ b).count_ones()).sum();
            // Either a bit of a later byte flipped, or of the first (then
            // every other byte differs from it by that bit).
            assert!(flipped == 1 || flipped == 39, "frame {i}: {flipped} bits");
        }
    }

    #[test]
    fn delay_holds_frames_until_their_time() {
        let m = Inject::new(fake(5), spec("delay=30ms"));
        let mut b = RecvBatch::new(64, 2048);
        assert_eq!(m.recv(&mut b).unwrap(), 0, "held at first");
        let got = drain(&m, Duration::from_millis(200));
        assert_eq!(got.len(), 5, "released later");
    }

    #[test]
    fn reorder_reorders_and_the_same_seed_repeats() {
        let run = |seed: u64| {
            let m = Inject::new(fake(60), spec(&format!("reorder=0.3,seed={seed}")));
            drain(&m, Duration::from_millis(30))
                .into_iter()
                .map(|f| f[0])
                .collect::<Vec<u8>>()
        };
        let a = run(11);
        assert_eq!(a.len(), 60, "nothing lost");
        assert!(
            a.windows(2).any(|w| w[0] > w[1]),
            "some frame overtaken: {a:?}"
        );
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..60).collect::<Vec<u8>>());
        // Same seed, same faults (the order of held frames may vary with
        // timing, so compare which frames were held).
        let held = |seed| {
            let m = Inject::new(fake(60), spec(&format!("reorder=0.3,seed={seed}")));
            let mut b = RecvBatch::new(64, 2048);
            m.recv(&mut b).unwrap();
            m.recv(&mut b).unwrap();
            m.fault_stats().reordered
        };
        assert_eq!(held(11), held(11));
    }
}
