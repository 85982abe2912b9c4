//! The stream's table, text chart and plot.

use super::traces::Layer;
use super::StreamOut;
use crate::anatomy::plot::{self, Bar, Chart};
use anyhow::Result;
use std::path::Path;

/// Bytes per second as MB/s (1 MB = 1e6 B) and messages per second.
fn rate(bytes_per_s: f64, size: usize) -> String {
    format!(
        "{:.1} MB/s ({} msgs/s)",
        bytes_per_s / 1e6,
        crate::report::fmt_rate(bytes_per_s / size.max(1) as f64)
    )
}

/// The row name of a layer.
pub fn row_name(l: &Layer) -> String {
    format!(
        "{}: {}",
        if l.side == "send" {
            "sender"
        } else {
            "receiver"
        },
        l.name
    )
}

/// How busy each CPU was at the measured rate.
fn busy(s: &StreamOut) -> String {
    if s.measured_bytes_per_s <= 0.0 {
        return String::new();
    }
    let every = s.size as f64 / s.measured_bytes_per_s * 1e9;
    let (send, recv) = (s.sender_ns / every, s.receiver_ns / every);
    let mut out = format!(
        "at the measured rate a message every {:.0} ns: the sender's CPU worked {:.0}% of it on the stream, the receiver's {:.0}%; the rest is waiting\n",
        every,
        100.0 * send,
        100.0 * recv
    );
    if send.max(recv) > 1.1 {
        out += "(over 100%: tracing slows this stream more than the checkpoints' measured cost, which is taken out; compare the traced throughput with the untraced)\n";
    }
    out
}

/// The round drawn in characters: a row per layer, each message's time in
/// it marked with its number's last digit, `width` columns for the round.
pub fn text_chart(s: &StreamOut, width: usize) -> String {
    let end = s.chart.iter().map(|b| b.end_ns).fold(0.0, f64::max);
    if end <= 0.0 || width == 0 {
        return String::new();
    }
    let names: Vec<String> = s.layers.iter().map(row_name).collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (r, name) in names.iter().enumerate() {
        let mut line = vec![' '; width];
        for b in s.chart.iter().filter(|b| b.row == r) {
            let from = ((b.start_ns / end * width as f64) as usize).min(width - 1);
            let to = ((b.end_ns / end * width as f64).ceil() as usize).clamp(from + 1, width);
            let mark = char::from_digit((b.message % 10) as u32, 10).unwrap_or('#');
            for c in &mut line[from..to] {
                *c = mark;
            }
        }
        out += &format!(
            "{name:<w$} |{}|\n",
            line.iter().collect::<String>().trim_end()
        );
    }
    out += &format!(
        "{:<w$}  0{:>width$}\n",
        "",
        format!("{:.1} us", end / 1e3),
        width = width - 1
    );
    out
}

/// The printed report.
pub fn table(s: &StreamOut) -> String {
    let mut out = format!(
        "stream of {} x {} B messages, {} ({}): {} rounds x {} pairs; {} of {} messages followed along the common path\n",
        s.stream, s.size, s.provider, s.mode, s.rounds, s.pairs, s.messages_kept, s.messages
    );
    let w = s
        .layers
        .iter()
        .map(|l| l.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    out += &format!(
        "{:<w$} {:>4} {:>9}   (mean per message, the slowest 1% left out)\n",
        "layer", "side", "ns/msg"
    );
    for (i, l) in s.layers.iter().enumerate() {
        out += &format!(
            "{:<w$} {:>4} {:>9.0}{}\n",
            l.name,
            l.side,
            l.ns,
            if i == s.bottleneck {
                "  <- bottleneck"
            } else {
                ""
            }
        );
    }
    let b = &s.layers[s.bottleneck];
    out += &format!(
        "\nmeasured throughput (untraced: K x size / first send call to the receiver's last return, median of {} rounds): {}\n",
        s.rounds * s.pairs,
        rate(s.measured_bytes_per_s, s.size)
    );
    out += &format!(
        "measured throughput (traced runs): {}; the sender's view (untraced, K x size / first send call to the ack): {}\n",
        rate(s.traced_bytes_per_s, s.size),
        rate(s.sender_view_bytes_per_s, s.size)
    );
    out += &format!(
        "theoretical maximum (003: size / max per-layer time = {} B / {:.0} ns): {}\n",
        s.size,
        b.ns,
        rate(s.theoretical_max_bytes_per_s, s.size)
    );
    out += &format!(
        "measured / theoretical: {:.2} (pairs {})\n",
        s.ratio,
        s.pair_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    out += &format!(
        "bottleneck layer: {} ({}, {:.0} ns per message)\n",
        b.name,
        if b.side == "send" {
            "the sender's CPU"
        } else {
            "the receiver's CPU"
        },
        b.ns
    );
    out += &format!(
        "layers on one CPU do not overlap: sender {:.0} ns, receiver {:.0} ns per message; size / the busier side ({}) = {} (measured / that: {:.2})\n",
        s.sender_ns,
        s.receiver_ns,
        if s.sender_ns >= s.receiver_ns {
            "the sender"
        } else {
            "the receiver"
        },
        rate(s.two_cpu_max_bytes_per_s, s.size),
        if s.two_cpu_max_bytes_per_s > 0.0 {
            s.measured_bytes_per_s / s.two_cpu_max_bytes_per_s
        } else {
            0.0
        }
    );
    out += &busy(s);
    out += "Figures are comparable within this run only (a shared, noisy machine).\n";
    out += &format!(
        "\nround {} drawn (the traced round of median length; digits are message numbers mod 10):\n",
        s.chart_round + 1
    );
    out += &text_chart(s, 100);
    for m in &s.missing {
        out += &format!("not seen: {m}\n");
    }
    out
}

/// The file of a stream's chart.
pub fn chart_svg(provider: &str) -> String {
    format!("anatomy-stream-{provider}.svg")
}

/// Draws the chart of the round into `dir`; returns the file's name.
pub fn plot(s: &StreamOut, dir: &Path) -> Result<String> {
    let file = chart_svg(&s.provider);
    let rows: Vec<String> = s
        .layers
        .iter()
        .map(|l| format!("{} ({:.0} ns)", row_name(l), l.ns))
        .collect();
    let bars: Vec<Bar> = s
        .chart
        .iter()
        .map(|b| Bar {
            row: b.row,
            start: b.start_ns,
            end: b.end_ns,
            color: plot::ALTERNATE[(b.message + 1) % 2],
            text: (b.row == 0).then(|| b.message.to_string()),
        })
        .collect();
    let b = &s.layers[s.bottleneck];
    let notes = vec![
        format!(
            "Measured (untraced, first send call to the receiver's last return): {}; measured / 003's maximum: {:.2}.",
            rate(s.measured_bytes_per_s, s.size),
            s.ratio
        ),
        format!(
            "003's maximum, size / max per-layer time: {} (the slowest layer: {}, {:.0} ns).",
            rate(s.theoretical_max_bytes_per_s, s.size),
            b.name,
            b.ns
        ),
        format!(
            "Per message: sender {:.0} ns, receiver {:.0} ns (layers on one CPU do not overlap); size / the busier: {}.",
            s.sender_ns,
            s.receiver_ns,
            rate(s.two_cpu_max_bytes_per_s, s.size)
        ),
        busy(s).trim_end().to_string(),
        "Messages alternate in colour; gaps on a row are waits. A row's time is its mean per message (the slowest 1% left out).".to_string(),
    ];
    let title = format!(
        "{}: a stream of {} x {} B messages through each layer (round {})",
        s.provider,
        s.stream,
        s.size,
        s.chart_round + 1
    );
    plot::chart(
        &dir.join(&file),
        &Chart {
            title: &title,
            rows: &rows,
            bars: &bars,
            legend: &[],
            notes: &notes,
        },
    )?;
    Ok(file)
}
