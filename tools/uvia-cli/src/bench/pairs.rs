//! Interleaved pairs of a contender and its baseline, and the headline
//! rows they make: the median of the pair ratios against the target.

use crate::report::{fmt_ns, push, text_table};
use crate::stats::median;
use anyhow::{anyhow, Result};
use indicatif::ProgressBar;
use serde::Serialize;

#[derive(Serialize, Clone)]
struct Pair {
    contender: f64,
    baseline: f64,
    ratio: f64,
    /// The cores' cache-line one-way (ns) read before the contender,
    /// between the two and after the baseline ([`crate::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    line_ns: Option<[f64; 3]>,
    /// Times the pair was measured: more than once where the host moved
    /// the cores during it.
    tries: usize,
}

impl Pair {
    /// Whether the host moved the cores during the measurement kept.
    fn moved(&self) -> bool {
        self.line_ns.is_some_and(|l| crate::placement::moved(&l))
    }
}

#[derive(Serialize, Clone)]
pub(crate) struct Headline {
    pub name: String,
    /// How the ratio is formed.
    ratio_is: String,
    unit: String,
    target: String,
    pairs: Vec<Pair>,
    /// Median of the pair ratios.
    pub ratio: Option<f64>,
    pub pass: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Headline {
    /// The measured (contender, baseline) pairs.
    pub(crate) fn pair_values(&self) -> Vec<(f64, f64)> {
        self.pairs
            .iter()
            .map(|p| (p.contender, p.baseline))
            .collect()
    }

    /// Of `runs`, one value per call of the contender in the order the
    /// calls were made, those of the measurements kept: the last try of
    /// each pair. Runs the pairs do not account for (a comparison ended by
    /// an error) are kept as they are.
    pub(crate) fn kept<T>(&self, runs: Vec<T>) -> Vec<T> {
        let tries: usize = self.pairs.iter().map(|p| p.tries).sum();
        if self.pairs.is_empty() || tries != runs.len() {
            return runs;
        }
        let mut runs = runs.into_iter();
        self.pairs
            .iter()
            .filter_map(|p| runs.by_ref().take(p.tries).last())
            .collect()
    }

    /// The same pairs judged by their worst ratio (the smallest: for a
    /// target of "at least"), as a comparison of its own.
    pub(crate) fn worst(&self, name: &str, target: &str, pass: impl Fn(f64) -> bool) -> Headline {
        let worst = self.pairs.iter().map(|p| p.ratio).reduce(f64::min);
        Headline {
            name: name.into(),
            ratio_is: format!("{} (the smallest of the pairs)", self.ratio_is),
            unit: self.unit.clone(),
            target: target.into(),
            pairs: self.pairs.clone(),
            ratio: worst,
            pass: worst.map(pass),
            error: self.error.clone(),
        }
    }

    /// A comparison that could not run, with the reason.
    pub(crate) fn skipped(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        why: String,
    ) -> Headline {
        Headline {
            name: name.into(),
            ratio_is: ratio_is.into(),
            unit: unit.into(),
            target: target.into(),
            pairs: Vec::new(),
            ratio: None,
            pass: None,
            error: Some(why),
        }
    }

    /// A comparison from measured (contender, baseline) pairs, or the
    /// reason there are none; `ratio(c, b)` per pair, `pass` on their
    /// median.
    pub(crate) fn from_pairs(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        pairs: std::result::Result<Vec<(f64, f64)>, String>,
        ratio: impl Fn(f64, f64) -> f64,
        pass: impl Fn(f64) -> bool,
    ) -> Headline {
        let pairs = match pairs {
            Ok(p) if !p.is_empty() => p,
            Ok(_) => return Headline::skipped(name, ratio_is, unit, target, "no pairs".into()),
            Err(why) => return Headline::skipped(name, ratio_is, unit, target, why),
        };
        let pairs = pairs
            .into_iter()
            .map(|(contender, baseline)| crate::placement::Measured {
                contender,
                baseline,
                line_ns: None,
                tries: 1,
            })
            .collect();
        Headline::from_measured(name, ratio_is, unit, target, pairs, ratio, pass)
    }

    /// A comparison from pairs measured with the cores' placement read
    /// around them ([`crate::placement::pair`]).
    pub(crate) fn from_measured(
        name: &str,
        ratio_is: &str,
        unit: &str,
        target: &str,
        pairs: Vec<crate::placement::Measured>,
        ratio: impl Fn(f64, f64) -> f64,
        pass: impl Fn(f64) -> bool,
    ) -> Headline {
        if pairs.is_empty() {
            return Headline::skipped(name, ratio_is, unit, target, "no pairs".into());
        }
        let pairs: Vec<Pair> = pairs
            .into_iter()
            .map(|m| Pair {
                contender: m.contender,
                baseline: m.baseline,
                ratio: ratio(m.contender, m.baseline),
                line_ns: m.line_ns,
                tries: m.tries,
            })
            .collect();
        let r = median(&pairs.iter().map(|p| p.ratio).collect::<Vec<_>>());
        Headline {
            name: name.into(),
            ratio_is: ratio_is.into(),
            unit: unit.into(),
            target: target.into(),
            pairs,
            ratio: Some(r),
            pass: Some(pass(r)),
            error: None,
        }
    }
}

/// Interleaves `pairs` rounds of contender and baseline; `ratio(c, b)`.
/// Each pair is measured with the cores' placement read around it, and
/// again where the host moved the cores during it ([`crate::placement`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn interleave(
    pb: &ProgressBar,
    name: &str,
    ratio_is: &str,
    unit: &str,
    target: &str,
    pairs: usize,
    mut contender: impl FnMut() -> Result<f64>,
    mut baseline: impl FnMut() -> Result<f64>,
    ratio: impl Fn(f64, f64) -> f64,
    pass: impl Fn(f64) -> bool,
) -> Headline {
    let mut measured = Vec::new();
    let mut error = None;
    for i in 0..pairs {
        pb.set_message(format!("headline: {name} (pair {}/{pairs})", i + 1));
        // Which side failed is said with its error.
        let m = crate::placement::pair(
            || contender().map_err(|e| anyhow!("contender: {e:#}")),
            || baseline().map_err(|e| anyhow!("baseline: {e:#}")),
            crate::placement::read,
        );
        match m {
            Ok(m) => measured.push(m),
            Err(e) => {
                error = Some(format!("{e:#}"));
                break;
            }
        }
        pb.inc(1);
    }
    match error {
        Some(e) => Headline::skipped(name, ratio_is, unit, target, e),
        None => Headline::from_measured(name, ratio_is, unit, target, measured, ratio, pass),
    }
}

fn verdict(h: &Headline) -> String {
    match (&h.error, h.pass) {
        // A side that was not there to run (a peer or MPI not installed or
        // not named), with the reason in the error.
        (Some(e), _) if e.starts_with("skipped") => "skipped".into(),
        (Some(_), _) => "FAILED".into(),
        (None, Some(true)) => "met".into(),
        (None, Some(false)) => "not met".into(),
        _ => "-".into(),
    }
}

fn fmt_val(v: f64, unit: &str) -> String {
    match unit {
        "ns" => fmt_ns(v),
        // Small figures (seconds, CPU percent) keep their tenths.
        _ if v.abs() < 100.0 => format!("{v:.2} {unit}"),
        _ => format!("{v:.0} {unit}"),
    }
}

/// The headline table's columns and rows.
pub(crate) fn headline_rows(hs: &[Headline]) -> ([&'static str; 6], Vec<Vec<String>>) {
    let head = [
        "comparison",
        "ratio (median of pairs)",
        "target",
        "verdict",
        "pair ratios",
        "contender / baseline (median)",
    ];
    let rows: Vec<Vec<String>> = hs
        .iter()
        .map(|h| {
            let pr = h
                .pairs
                .iter()
                .map(|p| format!("{:.2}{}", p.ratio, if p.moved() { "*" } else { "" }))
                .collect::<Vec<_>>()
                .join(" ");
            let cb = if h.pairs.is_empty() {
                "-".into()
            } else {
                format!(
                    "{} / {}",
                    fmt_val(
                        median(&h.pairs.iter().map(|p| p.contender).collect::<Vec<_>>()),
                        &h.unit
                    ),
                    fmt_val(
                        median(&h.pairs.iter().map(|p| p.baseline).collect::<Vec<_>>()),
                        &h.unit
                    )
                )
            };
            let ratio = h
                .ratio
                .map(|r| ratio_text(r, &h.target))
                .unwrap_or_else(|| "-".into());
            vec![h.name.clone(), ratio, h.target.clone(), verdict(h), pr, cb]
        })
        .collect();
    (head, rows)
}

/// A ratio as the tables show it: two decimals, or as many more (up to
/// five) as it takes not to land on its target's line (0.896 against
/// ">= 0.9x" read "0.90x", and "not met" beside it).
fn ratio_text(r: f64, target: &str) -> String {
    let line = first_number(target).filter(|line| (r - line).abs() > 1e-12);
    let on_line = |text: &str| {
        line.is_some_and(|line| text.parse::<f64>().is_ok_and(|v| (v - line).abs() < 1e-12))
    };
    let mut text = format!("{r:.2}");
    for decimals in 3..=5 {
        if !on_line(&text) {
            break;
        }
        text = format!("{r:.decimals$}");
    }
    text + "x"
}

/// The first number in `s` ("<= 1.15x" gives 1.15).
fn first_number(s: &str) -> Option<f64> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let rest = &s[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// What the placement readings around the pairs of `hs` showed: their
/// range, the pairs measured again and those kept though the cores moved
/// (marked `*` in the pair ratios); `None` where no pair was read.
pub(crate) fn placement_note(hs: &[Headline]) -> Option<String> {
    let pairs: Vec<&Pair> = hs.iter().flat_map(|h| &h.pairs).collect();
    let readings: Vec<f64> = pairs.iter().filter_map(|p| p.line_ns).flatten().collect();
    if readings.is_empty() {
        return None;
    }
    let lo = readings.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = readings.iter().copied().fold(0.0, f64::max);
    let again: usize = pairs.iter().map(|p| p.tries.saturating_sub(1)).sum();
    let kept = pairs.iter().filter(|p| p.moved()).count();
    Some(format!(
        "Placement of the two cores, read before, between and after the two runs of each pair (the cache-line ping-pong of `uvia limit`, a line each way, {} round trips): {lo:.0}-{hi:.0} ns one way over this run's {} pairs. Readings within a pair more than {}x apart mean the host moved the cores during it; such a pair is measured again, up to {} times: {again} measurements were made again{}.",
        crate::placement::ROUNDS,
        pairs.len(),
        crate::placement::MOVED,
        crate::placement::TRIES,
        if kept > 0 {
            format!("; pairs kept though the cores moved in every try (marked * in the pair ratios): {kept}")
        } else {
            String::new()
        }
    ))
}

/// The headline table as text, with the medians of both sides,
/// and what the placement readings around the pairs showed.
pub(crate) fn headline_text(hs: &[Headline]) -> String {
    let (head, rows) = headline_rows(hs);
    let mut text = text_table(&head, &rows);
    if let Some(note) = placement_note(hs) {
        push(&mut text, note);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ratio that two decimals would round onto its line shows a third,
    /// so that the verdict beside it reads true.
    #[test]
    fn a_ratio_next_to_its_line_shows_the_digit_that_decides() {
        assert_eq!(ratio_text(0.896, ">= 0.9x"), "0.896x");
        assert_eq!(ratio_text(1.004, "<= 1.0x"), "1.004x");
        assert_eq!(ratio_text(0.9, ">= 0.9x"), "0.90x");
        assert_eq!(ratio_text(0.93, ">= 0.9x"), "0.93x");
        assert_eq!(ratio_text(1.151, "<= 1.15x"), "1.151x");
        assert_eq!(ratio_text(31.52, ">= 15x lower"), "31.52x");
        assert_eq!(ratio_text(0.5, "-"), "0.50x");
        assert_eq!(ratio_text(0.8996, ">= 0.9x"), "0.8996x");
        assert_eq!(first_number("< 2%"), Some(2.0));
        assert_eq!(first_number("no line"), None);
    }

    #[test]
    fn the_worst_pair_is_judged_on_its_own() {
        let h = Headline::from_pairs(
            "goodput",
            "lossy / lossless",
            "MB/s",
            ">= 0.8x",
            Ok(vec![(90.0, 100.0), (55.0, 100.0), (85.0, 100.0)]),
            |c, b| c / b,
            |r| r >= 0.8,
        );
        assert_eq!(h.ratio, Some(0.85));
        assert_eq!(h.pass, Some(true));
        let w = h.worst("goodput, the worst pair", ">= 0.6x", |r| r >= 0.6);
        assert_eq!(w.ratio, Some(0.55));
        assert_eq!(w.pass, Some(false));
        assert_eq!(w.pair_values().len(), 3);
        // No pairs: no worst either, and the reason carried over.
        let none = Headline::from_pairs(
            "goodput",
            "lossy / lossless",
            "MB/s",
            ">= 0.8x",
            Err("the run failed".into()),
            |c, b| c / b,
            |r| r >= 0.8,
        );
        let w = none.worst("worst", ">= 0.6x", |r| r >= 0.6);
        assert_eq!((w.ratio, w.pass), (None, None));
        assert_eq!(w.error.as_deref(), Some("the run failed"));
    }

    #[test]
    fn the_report_marks_pairs_the_host_moved_and_says_what_was_measured_again() {
        use crate::placement::Measured;
        let m = |c: f64, line_ns: Option<[f64; 3]>, tries: usize| Measured {
            contender: c,
            baseline: 100.0,
            line_ns,
            tries,
        };
        let h = Headline::from_measured(
            "latency",
            "uvia / peer",
            "ns",
            "<= 1.0x",
            vec![
                m(90.0, Some([40.0, 45.0, 50.0]), 1),
                m(80.0, Some([300.0, 290.0, 310.0]), 2),
                m(120.0, Some([40.0, 300.0, 300.0]), 3),
            ],
            |c, b| c / b,
            |r| r <= 1.0,
        );
        assert_eq!(h.ratio, Some(0.9));
        let (_, rows) = headline_rows(std::slice::from_ref(&h));
        assert_eq!(rows[0][4], "0.90 0.80 1.20*");
        let note = placement_note(std::slice::from_ref(&h)).unwrap();
        assert!(
            note.contains("40-310 ns one way over this run's 3 pairs"),
            "{note}"
        );
        assert!(note.contains("3 measurements were made again"), "{note}");
        assert!(
            note.contains("moved in every try (marked * in the pair ratios): 1."),
            "{note}"
        );
        // Pairs without readings (the MPI study's own rounds) say nothing.
        let plain = Headline::from_pairs(
            "x",
            "a / b",
            "ns",
            "<= 1.0x",
            Ok(vec![(1.0, 2.0)]),
            |c, b| c / b,
            |r| r <= 1.0,
        );
        assert_eq!(placement_note(&[plain]), None);
    }

    #[test]
    fn the_runs_kept_are_the_last_try_of_each_pair() {
        use crate::placement::Measured;
        let m = |tries: usize| Measured {
            contender: 1.0,
            baseline: 1.0,
            line_ns: None,
            tries,
        };
        let h = Headline::from_measured(
            "x",
            "a / b",
            "ns",
            "<= 1.0x",
            vec![m(1), m(3), m(2)],
            |c, b| c / b,
            |r| r <= 1.0,
        );
        // Six calls of the contender: pair 1 once, pair 2 three times, pair 3 twice.
        assert_eq!(
            h.kept(vec!["a", "b1", "b2", "b3", "c1", "c2"]),
            ["a", "b3", "c2"]
        );
        // Runs that do not match the tries (an error ended the pairs) stay.
        assert_eq!(h.kept(vec!["a", "b"]), ["a", "b"]);
    }
}
