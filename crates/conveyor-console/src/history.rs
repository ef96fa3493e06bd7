//! The queues page's charts: the totals of each refresh, kept while the console runs, drawn as inline
//! SVG by the server (no script, nothing fetched from elsewhere; the strict CSP holds).
//!
//! A sampler takes the page's numbers every `history_every` whether or not a page is open, so the
//! charts cover the last [`KEPT`] samples from the moment the console started (an hour at the default
//! 15 s): one sample costs what one refresh of the queues page costs, which the page prints.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use maud::{Markup, PreEscaped, html};
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

/// Samples kept (the oldest go first).
pub(crate) const KEPT: usize = 240;
/// The charts' drawing size, in SVG units.
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 100.0;

/// The totals of one refresh.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Sample {
    pub(crate) visible: u64,
    pub(crate) in_flight: u64,
    pub(crate) dead: u64,
    /// Jobs succeeded per second across the scraped workers, once a rate is known.
    pub(crate) succeeded_per_second: Option<f64>,
    /// Errors per second across the scraped workers, once a rate is known.
    pub(crate) errors_per_second: Option<f64>,
}

/// The kept samples, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a sample, dropping the oldest beyond [`KEPT`].
    pub(crate) fn push(&self, sample: Sample) {
        let mut samples = self.lock();
        samples.push_back(sample);
        while samples.len() > KEPT {
            samples.pop_front();
        }
    }

    /// The kept samples, oldest first.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        self.lock().iter().copied().collect()
    }
}

/// Takes a sample every `history_every` until `stop` is cancelled.
pub(crate) async fn sample_until(state: Arc<AppState>, stop: CancellationToken) {
    let mut every = tokio::time::interval(state.config.history_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let snapshot = crate::queues::snapshot(&state, false).await;
        state.history.push(crate::queues::totals(&state, &snapshot));
    }
}

/// One line of a chart: its name, its CSS class (the colour) and a value per sample (`None`: unknown).
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) class: &'a str,
    pub(crate) values: Vec<Option<f64>>,
}

/// A chart of `series` over the kept samples, with its highest value on the axis.
pub(crate) fn chart(title: &str, id: &str, unit: &str, series: &[Series<'_>]) -> Markup {
    let top = series
        .iter()
        .flat_map(|line| line.values.iter().flatten())
        .fold(0.0_f64, |top, value| top.max(*value));
    let scale = if top > 0.0 { top } else { 1.0 };
    html! {
        figure class="chart" id=(id) {
            figcaption {
                (title)
                @for line in series {
                    " " span class={ "key " (line.class) } { "■" } " " (line.name)
                }
            }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" role="img" aria-label=(title) {
                line class="axis" x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
                @for line in series {
                    polyline class={ "series " (line.class) } fill="none" points=(points(&line.values, scale)) {}
                }
            }
            div class="chart-scale muted" {
                span { "top " (format_value(top)) (unit) }
                span { (samples_span(series)) }
            }
        }
    }
}

/// What the x axis covers, from the number of samples.
fn samples_span(series: &[Series<'_>]) -> String {
    let count = series.first().map_or(0, |line| line.values.len());
    format!("last {count} samples, newest right")
}

fn format_value(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The SVG points of `values` (unknown ones skipped), scaled so that `scale` is the top.
fn points(values: &[Option<f64>], scale: f64) -> PreEscaped<String> {
    let step = if values.len() > 1 {
        WIDTH / (values.len() - 1) as f64
    } else {
        0.0
    };
    let mut text = String::new();
    for (index, value) in values.iter().enumerate() {
        let Some(value) = value else { continue };
        let x = step * index as f64;
        let y = HEIGHT - value / scale * HEIGHT;
        let _ = write!(text, "{x:.1},{y:.1} ");
    }
    PreEscaped(text.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_run_left_to_right_with_the_highest_value_at_the_top() {
        let drawn = points(&[Some(0.0), None, Some(5.0), Some(10.0)], 10.0).0;
        assert_eq!(drawn, "0.0,100.0 400.0,50.0 600.0,0.0");
    }

    #[test]
    fn the_oldest_samples_go_beyond_the_kept_number() {
        let history = History::default();
        for visible in 0..(KEPT as u64 + 5) {
            history.push(Sample {
                visible,
                ..Sample::default()
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), KEPT);
        assert_eq!(samples[0].visible, 5);
    }

    #[test]
    fn a_chart_names_its_series_and_its_top() {
        let series = [Series {
            name: "visible",
            class: "s1",
            values: vec![Some(2.0), Some(8.0)],
        }];
        let markup = chart("Queue depth", "chart-depth", "", &series).into_string();
        assert!(markup.contains("top 8"), "{markup}");
        assert!(markup.contains(r#"points="0.0,75.0 600.0,0.0""#), "{markup}");
    }
}
